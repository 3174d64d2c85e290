"""A replica's /metrics: vLLM's own `PrometheusStatLogger`, each replica in its own registry.

vLLM registers its metrics in prometheus_client's global REGISTRY (and its constructor first
unregisters every `vllm:` collector there). The lab runs several replicas in one process, so
each logger's collectors are moved into a private registry right after construction.

Fed, each engine step, with the `SchedulerStats` the real scheduler returns and an
`IterationStats` built from its outputs as vLLM's frontend (`OutputProcessor`) builds it, with the
simulated clock for timestamps. Imports vLLM: load it only from the lab.
"""

from __future__ import annotations

import threading

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from vllm.config import VllmConfig
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import (
    IterationStats,
    LoRARequestStates,
    RequestStateStats,
    SchedulerStats,
)

_CONSTRUCTION = threading.Lock()


def _vllm_collectors(registry: CollectorRegistry) -> list[Collector]:
    names = registry._collector_to_names  # as vLLM's unregister_vllm_metrics reads it
    return [c for c in list(names) if str(getattr(c, "_name", "")).startswith("vllm:")]


class _RequestState:
    __slots__ = ("is_prefilling", "max_tokens", "num_cached_tokens", "prompt_len", "stats")

    def __init__(self, arrival_ts: float, prompt_len: int, max_tokens: int) -> None:
        self.stats = RequestStateStats(arrival_time=arrival_ts)
        self.is_prefilling = True
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.num_cached_tokens = 0


class ReplicaMetrics:
    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.registry = CollectorRegistry()
        with _CONSTRUCTION:
            self._logger = PrometheusStatLogger(vllm_config, engine_indexes=[engine_index])
            for collector in _vllm_collectors(prometheus_client.REGISTRY):
                prometheus_client.REGISTRY.unregister(collector)
                self.registry.register(collector)
        self._lora = LoRARequestStates(log_stats=True)
        self._requests: dict[str, _RequestState] = {}
        self.finished = 0

    def add_request(
        self, request_id: str, arrival_ts: float, prompt_len: int, max_tokens: int
    ) -> None:
        self._requests[request_id] = _RequestState(arrival_ts, prompt_len, max_tokens)

    def forget(self, request_ids: list[str]) -> None:
        """Requests that left without finishing (aborted): they will have no more outputs."""
        for request_id in request_ids:
            self._requests.pop(request_id, None)

    def record_step(
        self,
        scheduler_stats: SchedulerStats | None,
        outputs: list[EngineCoreOutput],
        now_ts: float,
        step_start_ts: float,
    ) -> None:
        """One engine step: what the frontend would log from these outputs at `now_ts`."""
        iteration = IterationStats()  # type: ignore[no-untyped-call,unused-ignore]
        iteration.iteration_timestamp = now_ts
        for output in outputs:
            state = self._requests.get(output.request_id)
            if state is None:
                continue
            # Engine-core events carry monotonic timestamps; put them on the simulated clock.
            for event in output.events or ():
                if event.type == EngineCoreEventType.QUEUED:
                    event.timestamp = state.stats.arrival_time
                else:
                    event.timestamp = step_start_ts
            iteration.update_from_output(
                output, now_ts, state.is_prefilling, state.stats, self._lora, None
            )
            if state.is_prefilling and output.prefill_stats is not None:
                state.num_cached_tokens = output.prefill_stats.num_cached_tokens
            state.is_prefilling = False
            if output.finish_reason is not None:
                iteration.update_from_finished_request(
                    finish_reason=output.finish_reason,
                    request_id=output.request_id,
                    num_prompt_tokens=state.prompt_len,
                    max_tokens_param=state.max_tokens,
                    req_stats=state.stats,
                    num_cached_tokens=state.num_cached_tokens,
                )
                del self._requests[output.request_id]
                self.finished += 1
        self._logger.record(scheduler_stats, iteration, engine_idx=self.engine_index)

    def text(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
