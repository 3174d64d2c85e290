#!/usr/bin/env bash
# Installs vLLM's pure-Python scheduler, block pool and event publisher on the CPU build of torch,
# into the active Python environment. kvscope itself never imports vLLM: this is for the
# integration tests and the lab, which use vLLM's own code as the event source.
# vLLM 0.33.0 pins torch 2.14.0, but its pure-Python parts run on 2.13.0 (a CPU build of which is
# on the project machines), so vLLM goes in with --no-deps and its imports are listed by hand.
set -euo pipefail
PY=${PYTHON:-python}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}

if "$PY" -c "import vllm, sys; sys.exit(0 if vllm.__version__ == '$VLLM_VERSION' else 1)" 2>/dev/null; then
  echo "vllm $VLLM_VERSION already installed"
  exit 0
fi
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q --no-deps "vllm==$VLLM_VERSION"
"$PY" -m pip install -q msgspec pyzmq cbor2 "transformers<5.21" pydantic fastapi openai pillow \
  regex psutil numpy prometheus_client cachetools cloudpickle pybase64 py-cpuinfo uvloop aiohttp \
  requests partial-json-parser apache-tvm-ffi einops sentencepiece tokenizers protobuf \
  diskcache lark gguf mistral_common blake3 watchfiles setproctitle pyyaml
"$PY" -m pip install -q --no-deps xgrammar==0.2.8 "llguidance>=1.7,<1.8"
"$PY" -m pip install -q oss-harmony || "$PY" -m pip install -q openai-harmony
VLLM_TARGET_DEVICE=cpu "$PY" -c "import vllm.v1.core.kv_cache_manager, vllm.distributed.kv_events; print('vllm', __import__('vllm').__version__, 'ready')"
