#!/usr/bin/env bash
# The test suite, every part of it (no test is skipped in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q "$@"
