"""The lab: simulated vLLM replicas running vLLM's real v1 `Scheduler` with no model.

Each `LabReplica` (`kvscope.lab.replica`) drives vLLM's own `Scheduler`, `KVCacheManager`,
`BlockPool` and `ZmqEventPublisher` (prefix caching on) with a fake model runner, open-loop
Poisson arrivals over shared system prompts, and resets in three modes; it serves an HTTP API
shaped like vLLM's (`/reset_prefix_cache`, `/metrics`, `/kv_event_sources`) and can record its
stream in the capture format of `kvscope/data/FORMAT.md`, with BlockPool ground truth.

By concern: `settings` (engine settings, step time), `presets` (named load models) and
`study` (a preset against the study's figures), `workload` (the load model, reset schedules),
`clock` (simulated time), `engine_build`, `engine` and `keep_reset` (vLLM's scheduler with no
model: build, step, reset, ground truth), `reset_record` and `driver` (the driving loop),
`metrics` (/metrics), `http` (the API), `recorder` and `sidecar` (recordings), `replica` (all
of it as one replica), `runner`, `cli`, `report`, `ports`.

Only this package imports vLLM, and only in the modules the `lab` command loads (`engine_build`,
`engine`, `keep_reset`, `metrics`, `driver`, `sidecar`, `replica`, `runner`, `study`); the
others do not.
Importing the package sets VLLM_TARGET_DEVICE=cpu, HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1
unless already set: vLLM reads them when it is imported (the lab runs it on CPU, offline).
"""

import os

for _name, _value in (
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
):
    os.environ.setdefault(_name, _value)
