#!/usr/bin/env bash
# Everything the tests need: in ./.venv, kvscope (editable) with its test extras and vLLM's
# scheduler on CPU torch (the integration tests' event source); on the machine, a Prometheus
# server and headless Chromium (Debian packages; scripts/install-test-services.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# grafana-client's niquests pulls urllib3-future, whose wheel overwrites urllib3 (and breaks
# requests-based tools); built from source with this flag it installs beside urllib3 instead.
export URLLIB3_NO_OVERRIDE=true
.venv/bin/python -m pip install -q --no-binary urllib3-future urllib3-future
.venv/bin/python -m pip install -q -e '.[test]'
PYTHON=.venv/bin/python bash scripts/install-vllm.sh
bash scripts/install-test-services.sh
