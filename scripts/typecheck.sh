#!/usr/bin/env bash
# mypy --strict over the kvscope package, its tests and its benchmarks. The source folders install
# under the `kvscope` namespace (see pyproject.toml), so mypy reads them through a tree of links
# with that layout; tests/ is the `tests` package, each benchmark a top-level module.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.build/typecheck
rm -rf "$tree" && mkdir -p "$tree/kvscope" "$tree/benchmarks"
for f in kvscope/*.py kvscope/py.typed kvscope/*/; do
    # An in-place build links the source folders into kvscope/ too: those come from the top.
    case "${f%/}" in kvscope/collector | kvscope/storage | kvscope/api | kvscope/dashboards) continue ;; esac
    ln -s "$PWD/${f%/}" "$tree/kvscope/"
done
for d in collector storage api dashboards; do ln -s "$PWD/$d" "$tree/kvscope/$d"; done
ln -s "$PWD/tests" "$tree/tests"
for f in benchmarks/*.py; do ln -s "$PWD/$f" "$tree/benchmarks/"; done
# The cache outside the tree, which is made anew each run: only what changed is checked again.
cd "$tree" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" \
    --cache-dir "$OLDPWD/.mypy_cache" kvscope tests benchmarks
