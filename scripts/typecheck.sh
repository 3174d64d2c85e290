#!/usr/bin/env bash
# mypy --strict over the kvscope package. The source folders install under the `kvscope`
# namespace (see pyproject.toml), so mypy reads them through a tree of links with that layout.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.build/typecheck
rm -rf "$tree" && mkdir -p "$tree/kvscope"
for f in kvscope/*.py kvscope/py.typed kvscope/*/; do ln -s "$PWD/${f%/}" "$tree/kvscope/"; done
for d in collector storage api dashboards; do ln -s "$PWD/$d" "$tree/kvscope/$d"; done
cd "$tree" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p kvscope
