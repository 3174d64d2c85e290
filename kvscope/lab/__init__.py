"""The lab: simulated vLLM replicas running vLLM's real v1 `Scheduler` with no model.

Each `LabReplica` (in `kvscope.lab.replica`) drives vLLM's own `Scheduler`, `KVCacheManager`,
`BlockPool` and `ZmqEventPublisher` (prefix caching on) with a fake model runner, open-loop
Poisson arrivals over shared system prompts, and resets in three modes; it serves an HTTP API
shaped like vLLM's (`/reset_prefix_cache`, `/metrics`, `/kv_event_sources`) and can record its
stream in the capture format of `kvscope/data/FORMAT.md`, with BlockPool ground truth.

Only this package imports vLLM, and only in the modules the `lab` command loads
(`replica`, `metrics`, `runner`): importing `kvscope.lab`, `kvscope.lab.cli`,
`kvscope.lab.workload`, `kvscope.lab.http`, `kvscope.lab.recorder` or `kvscope.lab.report`
does not.
"""
