#!/usr/bin/env bash
# Record lab captures like those in tests/data/ and kvscope/data/ (vLLM's real v1 Scheduler, no model):
# the stream as a SUB socket received it, plus a sidecar with BlockPool ground truth.
#   bash scripts/make-capture.sh [OUT_DIR]          (default: ./captures)
# Needs vLLM on CPU torch in .venv (scripts/install-vllm.sh). About 2 s per capture.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-captures}
mkdir -p "$out"
lab=(.venv/bin/python -m kvscope.lab)
"${lab[@]}" --rate 3 --duration 180 --seed 7 \
  --resets 45:default,90:preempt,135:keep \
  --record "$out/lab_3rps_180s.msgpack.gz"
"${lab[@]}" --rate 10 --duration 300 --seed 5 --num-blocks 1000 \
  --resets 50:default,100:preempt,150:keep,200:keep,250:preempt \
  --record "$out/lab_10rps_300s.msgpack.gz"
