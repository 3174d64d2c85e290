"""One simulated vLLM replica: an engine, its load, its driving loop, its API, its recording.

`LabReplica` is a `Driver` (kvscope.lab.driver: the loop, the resets) over an `Engine`
(kvscope.lab.engine: vLLM's real v1 Scheduler with no model), fed by a `Workload`, with
vLLM's own metrics behind /metrics, vLLM-shaped HTTP (kvscope.lab.http) and, with `record`,
the stream as a SUB socket received it plus a sidecar with BlockPool ground truth.

    with LabReplica("a", WorkloadSpec(rate=3), resets=parse_resets("45:keep")) as replica:
        replica.run_for(60)                 # simulated seconds; speed 0 = as fast as possible
        replica.reset(ResetMode.PREEMPT)    # between steps, from the driving thread
        replica.truth_counts()              # BlockPool.cached_block_hash_to_block, as ints

Importing this module imports vLLM (slow).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from vllm.v1.request import Request

from kvscope.lab.clock import SimClock
from kvscope.lab.driver import Driver
from kvscope.lab.engine import BatchObserver, Engine, TruthCounts
from kvscope.lab.http import LabHTTPServer, ResetUnavailable
from kvscope.lab.metrics import ReplicaMetrics
from kvscope.lab.recorder import StreamRecorder
from kvscope.lab.report import ReplicaSummary
from kvscope.lab.settings import EngineSettings
from kvscope.lab.sidecar import build_sidecar, sidecar_path_for
from kvscope.lab.workload import ResetMode, ScheduledReset, Workload, WorkloadSpec

logger = logging.getLogger(__name__)


def check_fits(workload: WorkloadSpec, engine: EngineSettings) -> None:
    """The longest request the workload can draw must fit the model and the KV cache."""
    need = workload.max_request_tokens
    if need > engine.max_model_len:
        raise ValueError(
            f"the longest request ({need} tokens) exceeds max_model_len {engine.max_model_len}"
        )
    if need + engine.block_size > (engine.num_blocks - 1) * engine.block_size:
        raise ValueError(
            f"the longest request ({need} tokens) does not fit in {engine.num_blocks} blocks "
            f"of {engine.block_size}"
        )
    if workload.aligned_prob > 0 and workload.block_size != engine.block_size:
        raise ValueError("aligned prompts need the workload's block_size to be the engine's")


class LabReplica(Driver):
    """One simulated replica. See the module docstring."""

    def __init__(
        self,
        name: str = "lab",
        workload: WorkloadSpec | None = None,
        engine: EngineSettings | None = None,
        *,
        stream: int = 0,
        rank: int = 0,
        speed: float = 0.0,
        port: int = 0,
        replay_port: int | None = 0,
        http_port: int | None = 0,
        http_host: str = "127.0.0.1",
        record: str | Path | None = None,
        resets: Sequence[ScheduledReset] = (),
        snapshot_every: float | None = 30.0,
        http_timeout_s: float = 30.0,
        preset: str | None = None,
        publish_to: str | None = None,
    ) -> None:
        """Build the engine, bind its sockets, start its HTTP server; nothing runs yet.

        `port`/`replay_port`/`http_port` 0: chosen by the OS; `replay_port`/`http_port` None:
        off. With `rank` r the publisher binds `port` + r and `replay_port` + r, as vLLM's DP
        rank r does. `speed`: 1 runs in real time, 10 ten times faster, 0 as fast as possible.
        `record`: write the stream (as a SUB socket receives it) there at `close()`, with a
        JSON sidecar (`X.msgpack.gz` -> `X.json`). `preset`: its name, for the sidecar.
        `publish_to`: the publisher connects to this bound address (a fleet) instead of binding.
        """
        started = time.monotonic()
        self.workload_spec = workload or WorkloadSpec()
        self.settings = engine or EngineSettings()
        check_fits(self.workload_spec, self.settings)
        self.stream = stream
        self.preset = preset
        self.record_path = Path(record) if record is not None else None
        self.http_timeout_s = http_timeout_s
        self.recorder: StreamRecorder | None = None
        self.http: LabHTTPServer | None = None
        self.setup_s = 0.0
        self._ready = False
        """Built completely: close() writes the recording only then."""
        self._finished = False
        clock = SimClock(speed)
        seed = self.workload_spec.seed
        built = Engine(
            self.settings,
            port=port,
            replay_port=replay_port,
            rank=rank,
            vocab=self.workload_spec.vocab,
            token_seed=f"kvscope-lab-tokens/{seed}/{stream}",
            publish_to=publish_to,
        )
        try:
            metrics = ReplicaMetrics(built.vllm_config)
        except BaseException:
            built.close()
            raise
        workload_ = Workload(self.workload_spec, stream, prefix=f"{name}-req")
        super().__init__(name, built, workload_, clock, metrics, resets, snapshot_every)
        try:
            if self.record_path is not None:
                topic = self.settings.topic.encode()
                self.recorder = StreamRecorder(self.connect_endpoint, topic)
                self.recorder.start()
            if http_port is not None:
                self.http = LabHTTPServer(self, http_host, http_port)
                self.http.start()
        except BaseException:
            self.close()
            raise
        clock.restart()
        self.setup_s = time.monotonic() - started
        self._ready = True

    # --- addresses ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.engine.port

    @property
    def replay_port(self) -> int | None:
        return self.engine.replay_port

    @property
    def endpoint(self) -> str:
        """The publisher's endpoint as vLLM resolved it (binds every interface)."""
        return f"tcp://*:{self.port}"

    @property
    def connect_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_connect_endpoint(self) -> str | None:
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def http_url(self) -> str | None:
        return None if self.http is None else self.http.url

    # --- the engine's state, as the tests and the demo read it ----------------------------------
    @property
    def last_seq(self) -> int | None:
        """The seq of the last batch handed to the publisher."""
        return self.engine.last_seq

    @property
    def batches_published(self) -> int:
        return self.engine.published.batches

    @property
    def events(self) -> Counter[str]:
        return self.engine.published.events

    @property
    def cleared_seqs(self) -> list[int]:
        return self.engine.published.cleared_seqs

    @property
    def batch_observers(self) -> list[BatchObserver]:
        return self.engine.batch_observers

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def running_requests(self) -> list[Request]:
        return self.engine.running_requests

    @property
    def held_blocks(self) -> int:
        return self.engine.held_blocks

    @property
    def pending_events(self) -> int:
        return self.engine.pending_events

    def truth_counts(self) -> TruthCounts:
        return self.engine.truth_counts()

    def abort_running(self) -> list[str]:
        """Abort every running request (as clients that went away); returns their ids."""
        ids = [r.request_id for r in self.engine.running_requests]
        self.engine.abort(ids)
        self.metrics.forget(ids)
        return ids

    # --- what the HTTP server asks --------------------------------------------------------------
    def http_reset(self, reset_running_requests: bool, reset_external: bool, keep: bool) -> bool:
        mode = (
            ResetMode.KEEP
            if keep
            else ResetMode.PREEMPT
            if reset_running_requests
            else ResetMode.DEFAULT
        )
        future = self.submit_reset(mode, reset_external, source="http")
        try:
            return future.result(timeout=self.http_timeout_s).result
        except FutureTimeout as exc:
            future.cancel()
            raise ResetUnavailable(
                f"the engine did not apply the reset within {self.http_timeout_s} s"
            ) from exc

    def metrics_text(self) -> bytes:
        return self.metrics.text()

    def event_sources(self) -> dict[str, dict[str, Any]]:
        return self.engine.event_sources()

    def version(self) -> str:
        return metadata.version("vllm")

    # --- results --------------------------------------------------------------------------------
    def summary(self) -> ReplicaSummary:
        return ReplicaSummary(
            name=self.name,
            sim_s=round(self.sim_t, 6),
            wall_s=round(self.wall_s, 3),
            steps=self.steps,
            requests_admitted=self.requests_admitted,
            requests_finished=self.metrics.finished,
            idle_s=round(self.idle_s, 6),
            idle_periods=self.idle_periods,
            preemptions=self.preemptions,
            batches_published=self.batches_published,
            resets=list(self.resets),
        )

    def sidecar(self) -> dict[str, Any]:
        """The JSON beside a recording (see kvscope/data/FORMAT.md)."""
        return build_sidecar(self)

    @property
    def sidecar_path(self) -> Path | None:
        return None if self.record_path is None else sidecar_path_for(self.record_path)

    # --- shutting down --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the loop, take a final snapshot, publish and record what is left, write files."""
        if self._finished:
            return
        self._finished = True
        self.stop_driving()
        recorder = self.recorder
        try:
            if self.http is not None:
                self.http.close()
            if self._ready and (self.steps or self.resets):
                self.snapshot("final")
            if self._ready and recorder is not None and not recorder.drain(self.last_seq):
                logger.warning("replica %s: the recorder did not receive every batch", self.name)
        finally:
            self.engine.close()
            if recorder is not None:
                recorder.close()
            if self._ready and self.record_path is not None and recorder is not None:
                recorder.write(self.record_path)
                sidecar = sidecar_path_for(self.record_path)
                sidecar.write_text(json.dumps(self.sidecar(), indent=1) + "\n")

    def __enter__(self) -> LabReplica:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
