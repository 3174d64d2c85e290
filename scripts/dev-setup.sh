#!/usr/bin/env bash
# Everything the tests need, in ./.venv: kvscope (editable) with its test extras, and vLLM's
# scheduler on CPU torch as the integration tests' event source.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
PYTHON=.venv/bin/python bash scripts/install-vllm.sh
