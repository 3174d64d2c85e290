"""One simulated vLLM replica: vLLM's real v1 `Scheduler` with no model behind it.

What is real (vLLM 0.33's own code): the `Scheduler` (chunked prefill, preemption, prefix-cache
lookups), its `KVCacheManager` and `BlockPool` (prefix caching on, LRU eviction, KV events),
its `ZmqEventPublisher` (PUB + replay ROUTER, one batch per step), its `reset_prefix_cache`,
its `SchedulerStats`, and the `PrometheusStatLogger` behind /metrics. What is simulated: the
model runner (one random token per scheduled request; none for a partial prefill chunk), the
step time (`step_base_s + step_per_token_s * scheduled_tokens` simulated seconds), the clock
(simulated seconds since start; the batch `ts` comes from a patched `time.time` in
`vllm.v1.core.sched.scheduler` only), the traffic (`kvscope.lab.workload`), and the proposed
keep-running reset (BlockPool's reset body without its all-blocks-free guard).

    with LabReplica("a", WorkloadSpec(rate=3), resets=parse_resets("45:keep")) as replica:
        replica.run_for(60)                 # simulated seconds; speed 0 = as fast as possible
        replica.reset(ResetMode.PREEMPT)    # between steps, from the driving thread
        replica.truth_counts()              # BlockPool.cached_block_hash_to_block, as ints

One thread drives the scheduler: the caller's (`step`, `run_for`, `run_until`) or, after
`start()`, the replica's own. Resets from other threads (HTTP) go through `submit_reset`, a
thread-safe queue applied between steps.

Importing this module imports vLLM (slow: ~6 s) and sets VLLM_TARGET_DEVICE=cpu,
HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 unless already set.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import dataclasses
import errno
import hashlib
import json
import logging
import platform
import queue
import random
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import vllm
import vllm.envs as envs
import zmq
from vllm.config import CacheConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.block_pool import BlockHashToBlockMap, BlockPool
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched import scheduler as scheduler_module
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvscope import __version__
from kvscope.lab.http import LabHTTPServer, ResetUnavailable
from kvscope.lab.metrics import ReplicaMetrics
from kvscope.lab.recorder import StreamRecorder
from kvscope.lab.report import ReplicaSummary, ResetRecord
from kvscope.lab.workload import ResetMode, ScheduledReset, Workload, WorkloadSpec

logger = logging.getLogger(__name__)

HASH_MASK = (1 << 64) - 1
TruthCounts = dict[tuple[int, int], int]
"""(int block hash, KV cache group) -> physical copies: the shape of `PrefixMap.counts()`."""
BatchObserver = Callable[[int, KVEventBatch], None]
"""Called on the driving thread with (seq, batch) as each batch is handed to the publisher."""

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 32_000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float16",
}
"""A two-layer Llama config.json with no weights: all ModelConfig needs."""

CAPTURE_FORMAT = (
    "gzip'ed msgpack stream; one record per received ZMQ message: [recv_ts float (subscriber "
    "time.time(), wall clock), topic bin (frame0), seq bin (frame1, 8-byte big-endian), payload "
    "bin (frame2 = vLLM KVEventBatch msgpack: [ts, [events...], dp_rank])]"
)
GROUND_TRUTH_NOTE = (
    "hashes: [block_hash as published in events, group_idx, number of blocks under that key in "
    "BlockPool.cached_block_hash_to_block]; valid for the consumer state after applying every "
    "batch with seq <= published_through_seq, when pending_events == 0"
)
CLOCK_NOTE = (
    "KVEventBatch.ts = sim_epoch + simulated seconds at end of the step (patched time.time in "
    "vllm.v1.core.sched.scheduler only)"
)


# --- the simulated clock ------------------------------------------------------------------------
_clock = threading.local()
_real_time = time


class _SchedulerTime:
    """Stands in for the `time` module inside `vllm.v1.core.sched.scheduler`, and only there.

    `time()` answers the simulated clock of the replica the calling thread drives (each driver
    sets its own, so replicas on different threads do not share a clock); anything else, and
    `time()` on a thread that drives no replica, is the real `time` module.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)

    @staticmethod
    def time() -> float:
        now: float | None = getattr(_clock, "now", None)
        return _real_time.time() if now is None else now


_install_lock = threading.Lock()


def install_sim_clock() -> None:
    with _install_lock:
        if not isinstance(getattr(scheduler_module, "time"), _SchedulerTime):  # noqa: B009
            setattr(scheduler_module, "time", _SchedulerTime())  # noqa: B010 - a module global


# --- settings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSettings:
    num_blocks: int = 400
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    topic: str = "kv-events"
    buffer_steps: int = 10_000
    """Batches the publisher keeps for replay."""
    step_base_s: float = 0.025
    step_per_token_s: float = 6e-5
    served_model_name: str = "lab"

    def step_time(self, scheduled_tokens: int) -> float:
        """Simulated seconds one engine step takes (a step with nothing scheduled takes none)."""
        if scheduled_tokens == 0:
            return 0.0
        return self.step_base_s + self.step_per_token_s * scheduled_tokens

    @property
    def step_time_model(self) -> str:
        return f"{self.step_base_s:g} + {self.step_per_token_s:g} * scheduled_tokens (sim s)"


# --- ports --------------------------------------------------------------------------------------
def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def free_port(exclude: Sequence[int] = ()) -> int:
    """A TCP port nothing listens on, chosen by the OS."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in exclude and _can_bind(port):
            return port
    raise RuntimeError("no free TCP port found")


def _int_hash(value: object) -> int:
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & HASH_MASK
    assert isinstance(value, int)
    return value & HASH_MASK


@dataclass
class _Command:
    mode: ResetMode
    reset_external: bool
    source: str
    future: Future[ResetRecord]


class LabReplica:
    """One simulated replica. See the module docstring."""

    def __init__(
        self,
        name: str = "lab",
        workload: WorkloadSpec | None = None,
        engine: EngineSettings | None = None,
        *,
        stream: int = 0,
        speed: float = 0.0,
        port: int = 0,
        replay_port: int | None = 0,
        http_port: int | None = 0,
        http_host: str = "127.0.0.1",
        record: str | Path | None = None,
        resets: Sequence[ScheduledReset] = (),
        snapshot_every: float | None = 30.0,
        http_timeout_s: float = 30.0,
    ) -> None:
        """Build the engine, bind its sockets, start its HTTP server; nothing runs yet.

        `port`/`replay_port`/`http_port` 0: chosen by the OS; `replay_port`/`http_port` None: off.
        `speed`: 1 runs in real time, 10 ten times faster, 0 as fast as possible.
        `record`: write the stream (as a SUB socket receives it) there at `close()`, with a JSON
        sidecar (`X.msgpack.gz` -> `X.json`).
        """
        started = time.monotonic()
        self.name = name
        self.workload_spec = workload or WorkloadSpec()
        self.engine = engine or EngineSettings()
        self.stream = stream
        if speed < 0:
            raise ValueError("speed must be >= 0")
        self.speed = speed
        self._check_fits()
        self.workload = Workload(self.workload_spec, stream, prefix=f"{name}-req")
        self.record_path = Path(record) if record is not None else None
        self._schedule = sorted(resets, key=lambda r: r.at)
        self.snapshot_every = snapshot_every
        self.http_timeout_s = http_timeout_s
        self.batch_observers: list[BatchObserver] = []

        self.sim_epoch = time.time()
        self.sim_t = 0.0
        self._token_rng = random.Random(f"kvscope-lab-tokens/{self.workload_spec.seed}/{stream}")
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.run_done = threading.Event()
        """Set when the background run (`start`) has reached its duration."""
        self._driver: threading.Thread | None = None
        self._driver_error: BaseException | None = None
        self._anchor = (time.monotonic(), 0.0)
        # Counters and records.
        self.steps = 0
        self.batches_published = 0
        self.events: Counter[str] = Counter()
        self.stored_hashes = 0
        self.removed_hashes = 0
        self.cleared_seqs: list[int] = []
        self.requests_admitted = 0
        self.scheduled_tokens = 0
        self.max_running = 0
        self.preemptions = 0
        self.ever_preempted: set[str] = set()
        self.idle_s = 0.0
        self.idle_periods = 0
        self._idle = False
        self.wall_s = 0.0
        self.setup_s = 0.0
        self._ready = False
        """Built completely: close() writes the recording only then."""
        self.resets: list[ResetRecord] = []
        self.snapshots: list[dict[str, Any]] = []
        self._awaiting_clear: list[ResetRecord] = []
        self._post_publish: list[ResetRecord] = []
        self._next_snapshot = snapshot_every if snapshot_every else None
        self._zero_token_steps = 0

        install_sim_clock()
        self._model_dir = tempfile.mkdtemp(prefix="kvscope-lab-model-")
        (Path(self._model_dir) / "config.json").write_text(json.dumps(TINY_LLAMA))
        self.recorder: StreamRecorder | None = None
        self.http: LabHTTPServer | None = None
        self._closed = False
        try:
            self.scheduler = self._make_scheduler(port, replay_port)
            self.block_pool: BlockPool = self.scheduler.kv_cache_manager.block_pool
            publisher = self.scheduler.kv_event_publisher
            self._publish = publisher.publish
            # Every batch the scheduler publishes passes through _on_publish first.
            setattr(publisher, "publish", self._on_publish)  # noqa: B010
            self.metrics = ReplicaMetrics(self.vllm_config)
            hash_fn = get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self._block_hasher = get_request_block_hasher(
                self.engine.block_size, hash_fn, self.vllm_config.num_hash_lookahead_tokens
            )
            if self.record_path is not None:
                self.recorder = StreamRecorder(
                    f"tcp://127.0.0.1:{self.port}", self.engine.topic.encode()
                )
                self.recorder.start()
            if http_port is not None:
                self.http = LabHTTPServer(self, http_host, http_port)
                self.http.start()
        except BaseException:
            self.close()
            raise
        self.sim_epoch = time.time()
        self.setup_s = time.monotonic() - started
        self._ready = True

    # --- construction ---------------------------------------------------------------------------
    def _check_fits(self) -> None:
        need = self.workload_spec.max_request_tokens
        engine = self.engine
        if need > engine.max_model_len:
            raise ValueError(
                f"the longest request ({need} tokens) exceeds max_model_len {engine.max_model_len}"
            )
        if need + engine.block_size > (engine.num_blocks - 1) * engine.block_size:
            raise ValueError(
                f"the longest request ({need} tokens) does not fit in {engine.num_blocks} blocks "
                f"of {engine.block_size}"
            )

    def _make_vllm_config(self, endpoint: str, replay_endpoint: str | None) -> VllmConfig:
        e = self.engine
        model = ModelConfig(
            model=self._model_dir,
            served_model_name=e.served_model_name,
            skip_tokenizer_init=True,
            dtype="float16",
            max_model_len=e.max_model_len,
        )
        scheduler = SchedulerConfig(
            max_model_len=e.max_model_len,
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=False,
        )
        cache = CacheConfig(block_size=e.block_size, enable_prefix_caching=True)
        events = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=endpoint,
            replay_endpoint=replay_endpoint,
            buffer_steps=e.buffer_steps,
            topic=e.topic,
        )
        return VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=cache,
            kv_events_config=events,
        )

    def _make_scheduler(self, port: int, replay_port: int | None) -> Scheduler:
        e = self.engine
        kv_cache_config = KVCacheConfig(
            num_blocks=e.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                    FullAttentionSpec(
                        block_size=e.block_size,
                        num_kv_heads=TINY_LLAMA["num_key_value_heads"],
                        head_size=TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"],
                        dtype=torch.float16,
                    ),
                )
            ],
        )
        for attempt in range(20):
            pub = port or free_port()
            replay = None
            if replay_port is not None:
                replay = replay_port or free_port(exclude=[pub])
            config = self._make_vllm_config(
                f"tcp://*:{pub}", None if replay is None else f"tcp://*:{replay}"
            )
            config.cache_config.num_gpu_blocks = e.num_blocks
            register_all_kvcache_specs(config)  # type: ignore[no-untyped-call,unused-ignore]
            try:
                scheduler = Scheduler(
                    vllm_config=config,
                    kv_cache_config=kv_cache_config,
                    structured_output_manager=StructuredOutputManager(config),
                    block_size=e.block_size,
                    hash_block_size=e.block_size,
                    include_finished_set=False,
                    log_stats=True,
                )
            except zmq.ZMQError as exc:
                chosen = port == 0 or replay_port == 0
                if exc.errno != errno.EADDRINUSE or not chosen or attempt == 19:
                    raise
                continue
            self.vllm_config = config
            self.port = pub
            self.replay_port = replay
            return scheduler
        raise AssertionError("unreachable")

    # --- addresses and state --------------------------------------------------------------------
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

    @property
    def ts(self) -> float:
        """The simulated wall clock: what the next batch's `ts` would read."""
        return self.sim_epoch + self.sim_t

    @property
    def last_seq(self) -> int | None:
        """The seq of the last batch handed to the publisher."""
        return self.batches_published - 1 if self.batches_published else None

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return int(self.scheduler.get_request_counts()[1])

    @property
    def running_requests(self) -> list[Request]:
        return list(self.scheduler.running)

    @property
    def held_blocks(self) -> int:
        """Blocks some request holds (the null block aside): 0 = a default reset succeeds."""
        pool = self.block_pool
        return int(pool.num_gpu_blocks) - 1 - int(pool.get_num_free_blocks())

    @property
    def pending_events(self) -> int:
        """KV events emitted but not yet published (they go out with the next step)."""
        return len(self.block_pool.kv_event_queue)

    def truth_counts(self) -> TruthCounts:
        """BlockPool.cached_block_hash_to_block, hash for hash, copy for copy (the ground truth)."""
        counts: TruthCounts = {}
        for key, blocks in self.block_pool.cached_block_hash_to_block._cache.items():
            copies = len(blocks) if isinstance(blocks, dict) else 1
            block_hash = _int_hash(maybe_convert_block_hash(get_block_hash(key)))
            counts[(block_hash, get_group_id(key))] = copies
        return counts

    def snapshot(self, label: str, keep: bool = True) -> dict[str, Any]:
        """The ground truth now, shaped like the captures' sidecar snapshots."""
        counts = self.truth_counts()
        snap = {
            "label": label,
            "sim_t": round(self.sim_t, 6),
            "ts": self.ts,
            "step": self.steps,
            "published_through_seq": self.last_seq,
            "pending_events": self.pending_events,
            "medium": "GPU",
            "num_running": self.num_running,
            "num_waiting": self.num_waiting,
            "num_free_blocks": self.block_pool.get_num_free_blocks(),
            "num_keys": len(counts),
            "num_cached_blocks": sum(counts.values()),
            "hashes": [[h, g, n] for (h, g), n in sorted(counts.items())],
        }
        if keep:
            self.snapshots.append(snap)
        return snap

    # --- driving --------------------------------------------------------------------------------
    def _check_driver(self) -> None:
        if self._closed:
            raise RuntimeError(f"replica {self.name} is closed")
        driver = self._driver
        if driver is not None and driver.is_alive() and driver is not threading.current_thread():
            raise RuntimeError(
                f"replica {self.name} is driven by its own thread (start()); use submit_reset"
            )

    def step(self) -> bool:
        """One engine step; when idle, first wait (simulated) for the next arrival.

        Pending resets, due scheduled resets and snapshots are applied first. Returns False
        when nothing will ever arrive again (no step ran).
        """
        self._check_driver()
        self._anchor = (time.monotonic(), self.sim_t)
        started = time.monotonic()
        try:
            while True:
                self._between_steps()
                if self.scheduler.has_requests():
                    self._engine_step()
                    return True
                target = self._next_wake(None)
                if target is None:
                    return False
                self._idle_until(target)
        finally:
            self.wall_s += time.monotonic() - started

    def run_for(self, seconds: float) -> None:
        """Run `seconds` of simulated time (at `speed`)."""
        self.run_until_time(self.sim_t + seconds)

    def run_until_time(self, sim_t: float) -> None:
        self._check_driver()
        self._anchor = (time.monotonic(), self.sim_t)
        started = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._between_steps()
                if self.sim_t >= sim_t:
                    break
                if self.scheduler.has_requests():
                    self._engine_step()
                    continue
                target = self._next_wake(sim_t)
                assert target is not None
                self._idle_until(target)
        finally:
            self.wall_s += time.monotonic() - started

    def run_until(self, condition: Callable[[], bool], max_seconds: float = 600.0) -> bool:
        """Step until `condition()` holds (checked between steps) or `max_seconds` passed."""
        self._check_driver()
        deadline = self.sim_t + max_seconds
        while not condition():
            if self.sim_t >= deadline or not self.step():
                return condition()
        return True

    def start(self, duration: float | None = None) -> None:
        """Drive the replica on its own thread until `duration` simulated seconds (or close).

        After the duration it stays up (HTTP, replay) and still applies resets, with no steps.
        """
        self._check_driver()
        if self._driver is not None:
            raise RuntimeError(f"replica {self.name} was started already")
        end = None if duration is None else duration

        def drive() -> None:
            try:
                if end is None:
                    while not self._stopping.is_set():
                        self.run_until_time(self.sim_t + 3600.0)
                else:
                    self.run_until_time(end)
            except BaseException as exc:
                self._driver_error = exc
                logger.exception("replica %s: the engine loop failed", self.name)
            finally:
                self.run_done.set()
            while not self._stopping.is_set():
                self.apply_pending(timeout=0.2)

        self._driver = threading.Thread(target=drive, name=f"lab-{self.name}", daemon=True)
        self._driver.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the background run reached its duration; re-raises an error of the loop."""
        done = self.run_done.wait(timeout)
        if self._driver_error is not None:
            raise RuntimeError(f"replica {self.name} failed") from self._driver_error
        return done

    # --- resets ---------------------------------------------------------------------------------
    def reset(
        self, mode: ResetMode | str = ResetMode.DEFAULT, reset_external: bool = False
    ) -> ResetRecord:
        """Reset now, between steps (from the driving thread, or any thread when none drives)."""
        self._check_driver()
        return self._do_reset(ResetMode(mode), reset_external, "api", None)

    def submit_reset(
        self,
        mode: ResetMode | str = ResetMode.DEFAULT,
        reset_external: bool = False,
        source: str = "api",
    ) -> Future[ResetRecord]:
        """Queue a reset for the driving thread (any thread may call this)."""
        future: Future[ResetRecord] = Future()
        if self._closed:
            future.set_exception(ResetUnavailable(f"replica {self.name} is closed"))
            return future
        self._commands.put(_Command(ResetMode(mode), reset_external, source, future))
        self._wake.set()
        return future

    def apply_pending(self, timeout: float = 0.0) -> int:
        """Apply queued resets (waiting up to `timeout` s for the first); returns how many.

        For a caller that drives the replica itself and wants HTTP resets applied while it
        does not step (they are otherwise applied at the next step).
        """
        self._check_driver()
        try:
            first = self._commands.get(timeout=timeout) if timeout > 0 else None
        except queue.Empty:
            return 0
        return self._apply_commands(first)

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

    def _apply_commands(self, first: _Command | None = None) -> int:
        applied = 0
        while True:
            if first is not None:
                command, first = first, None
            else:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    return applied
            if not command.future.set_running_or_notify_cancel():
                continue
            try:
                record = self._do_reset(command.mode, command.reset_external, command.source, None)
            except BaseException as exc:
                command.future.set_exception(exc)
                raise
            command.future.set_result(record)
            applied += 1

    def _do_reset(
        self, mode: ResetMode, reset_external: bool, source: str, requested: float | None
    ) -> ResetRecord:
        scheduler = self.scheduler
        running = list(scheduler.running)
        computed_before = {r.request_id: r.num_computed_tokens for r in running}
        running_before, waiting_before = len(running), self.num_waiting
        held_before = self.held_blocks
        seq_before = self.last_seq
        ever_before = len(self.ever_preempted)
        index = len(self.resets)
        label = f"reset{index}-{mode.value}"
        pre = self.snapshot(f"{label}-pre")
        hashed_before = int(pre["num_cached_blocks"])
        if mode == ResetMode.DEFAULT:
            result = scheduler.reset_prefix_cache(
                reset_running_requests=False, reset_connector=reset_external
            )
        elif mode == ResetMode.PREEMPT:
            result = scheduler.reset_prefix_cache(
                reset_running_requests=True, reset_connector=reset_external
            )
        else:
            result = self._keep_running_reset(reset_external)
        preempted = [r for r in running if r.status == RequestStatus.PREEMPTED]
        self.ever_preempted.update(r.request_id for r in preempted)
        post = self.snapshot(f"{label}-post")
        record = ResetRecord(
            index=index,
            mode=mode,
            source=source,
            requested_sim_t=requested,
            sim_t=round(self.sim_t, 6),
            ts=self.ts,
            step=self.steps,
            reset_external=reset_external,
            running_before=running_before,
            waiting_before=waiting_before,
            published_through_seq_before=seq_before,
            result=bool(result),
            running_after=self.num_running,
            waiting_after=self.num_waiting,
            preempted=len(preempted),
            computed_tokens_lost=sum(computed_before[r.request_id] for r in preempted),
            running_computed_tokens_before=sum(computed_before.values()),
            running_computed_tokens_after=sum(r.num_computed_tokens for r in running),
            requests_ever_preempted_before=ever_before,
            requests_ever_preempted_after=len(self.ever_preempted),
            pending_events_after=self.pending_events,
            held_blocks_before=held_before,
            held_blocks_after=self.held_blocks,
            hashed_blocks_before=hashed_before,
            hashed_blocks_after=int(post["num_cached_blocks"]),
            snapshots=[f"{label}-pre", f"{label}-post"],
        )
        if result and any(isinstance(e, AllBlocksCleared) for e in self.block_pool.kv_event_queue):
            self._awaiting_clear.append(record)
        self.resets.append(record)
        logger.info(
            "replica %s: %s reset at %.2f s: %s (running %d -> %d, preempted %d)",
            self.name,
            mode.value,
            self.sim_t,
            "success" if result else "failed",
            running_before,
            record.running_after,
            record.preempted,
        )
        return record

    def _keep_running_reset(self, reset_external: bool) -> bool:
        """The proposed keep-running reset: BlockPool's reset body without its guard.

        Every hash leaves the lookup and every block forgets its hash, but blocks held by
        running requests stay allocated in their block tables: those requests continue, and
        their next full blocks are stored with a parent that is no longer cached.
        """
        manager = self.scheduler.kv_cache_manager
        pool = self.block_pool
        empty = BlockHashToBlockMap()  # type: ignore[no-untyped-call,unused-ignore]
        pool.cached_block_hash_to_block = empty
        pool.cached_block_hashes_by_block.clear()
        if pool._reuse_watchers:
            pool._notify_reuse([pool.blocks[i] for i in list(pool._reuse_watchers)])
        for block in pool.blocks:
            block.reset_hash()  # type: ignore[no-untyped-call,unused-ignore]
        if pool.metrics_collector:
            pool.metrics_collector.reset()
        if pool.enable_kv_cache_events:
            pool.kv_event_queue.append(AllBlocksCleared())
        if manager.log_stats and manager.prefix_cache_stats is not None:
            manager.prefix_cache_stats.reset = True
        if reset_external:
            return bool(self.scheduler.reset_connector_cache())
        return True

    # --- the loop -------------------------------------------------------------------------------
    def _between_steps(self) -> None:
        self._apply_commands()
        while self._schedule and self._schedule[0].at <= self.sim_t:
            planned = self._schedule.pop(0)
            self._do_reset(planned.mode, False, "schedule", planned.at)
        if self._next_snapshot is not None and self.sim_t >= self._next_snapshot:
            self.snapshot(f"periodic-{self._next_snapshot:g}s")
            assert self.snapshot_every is not None
            while self._next_snapshot <= self.sim_t:
                self._next_snapshot += self.snapshot_every
        for spec in self.workload.due(self.sim_t):
            params = SamplingParams(max_tokens=spec.max_tokens)
            params.update_from_generation_config({}, eos_token_id=None)
            arrival_ts = self.sim_epoch + spec.arrival
            request = Request(
                request_id=spec.request_id,
                prompt_token_ids=list(spec.prompt),
                sampling_params=params,
                pooling_params=None,
                arrival_time=arrival_ts,
                block_hasher=self._block_hasher,
            )
            self.metrics.add_request(spec.request_id, arrival_ts, len(spec.prompt), spec.max_tokens)
            self.scheduler.add_request(request)
            self.requests_admitted += 1

    def _next_wake(self, end: float | None) -> float | None:
        """The next simulated instant something happens while idle; None: nothing ever will
        (no more arrivals or scheduled resets, and no end to run to)."""
        arrival = self.workload.next_arrival()
        reset = self._schedule[0].at if self._schedule else None
        if arrival is None and reset is None and end is None:
            return None
        times = [t for t in (arrival, reset, end, self._next_snapshot) if t is not None]
        return max(min(times), self.sim_t)

    def _wall_sim(self) -> float:
        wall, sim = self._anchor
        return sim + (time.monotonic() - wall) * self.speed

    def _idle_until(self, target: float) -> None:
        """No request in the engine: the clock moves to `target` (in real time at speed > 0),
        or to the moment a reset arrives."""
        if not self._idle:
            self._idle = True
            self.idle_periods += 1
        start = self.sim_t
        if self.speed > 0:
            while not self._stopping.is_set():
                now = self._wall_sim()
                if now >= target:
                    break
                if self._wake.wait(min((target - now) / self.speed, 0.5)):
                    self._wake.clear()
                    if not self._commands.empty():  # a reset arrived: apply it now
                        target = min(target, self._wall_sim())
                        break
            else:
                target = min(target, self._wall_sim())
        self.sim_t = max(self.sim_t, target)
        self.idle_s += self.sim_t - start

    def _engine_step(self) -> None:
        scheduler = self.scheduler
        self._idle = False
        step_start_ts = self.ts
        output = scheduler.schedule()
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        vocab = self.workload_spec.vocab
        for request_id in req_ids:
            request = scheduler.requests[request_id]
            # A partial prefill chunk samples nothing; any other scheduled request one token.
            if request.num_computed_tokens >= request.num_tokens:
                sampled.append([self._token_rng.randrange(vocab)])
            else:
                sampled.append([])
        if output.preempted_req_ids:
            self.preemptions += len(output.preempted_req_ids)
            self.ever_preempted.update(output.preempted_req_ids)
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        tokens = output.total_num_scheduled_tokens
        self.scheduled_tokens += tokens
        self.max_running = max(self.max_running, len(scheduler.running))
        if tokens == 0:
            self._zero_token_steps += 1
            if self._zero_token_steps > 1000:
                raise RuntimeError(f"replica {self.name}: the scheduler makes no progress")
        else:
            self._zero_token_steps = 0
        self.sim_t += self.engine.step_time(tokens)
        if self.speed > 0:
            wait = (self.sim_t - self._wall_sim()) / self.speed
            if wait > 0:
                time.sleep(wait)
        now_ts = self.ts
        _clock.now = now_ts
        try:
            outputs = scheduler.update_from_output(output, runner_output)
        finally:
            _clock.now = None
        self.steps += 1
        engine_outputs = []
        scheduler_stats = None
        for eco in outputs.values():
            engine_outputs.extend(eco.outputs)
            if eco.scheduler_stats is not None:
                scheduler_stats = eco.scheduler_stats
        self.metrics.record_step(scheduler_stats, engine_outputs, now_ts, step_start_ts)
        for record in self._post_publish:
            label = f"reset{record.index}-{record.mode.value}-post-publish"
            self.snapshot(label)
            record.snapshots.append(label)
        self._post_publish.clear()

    def _on_publish(self, batch: KVEventBatch) -> None:
        """Wraps the publisher's `publish`: the seq it will get, counts, cleared_in_seq."""
        seq = self.batches_published
        self.batches_published += 1
        for event in batch.events:
            self.events[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                self.stored_hashes += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.removed_hashes += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.cleared_seqs.append(seq)
                if self._awaiting_clear:
                    record = self._awaiting_clear.pop(0)
                    record.cleared_in_seq = seq
                    self._post_publish.append(record)
        for observer in self.batch_observers:
            observer(seq, batch)
        self._publish(batch)

    # --- what the HTTP server asks --------------------------------------------------------------
    def metrics_text(self) -> bytes:
        return self.metrics.text()

    def event_sources(self) -> dict[str, dict[str, Any]]:
        config = self.scheduler.get_kv_event_publisher_config()
        if config is None:
            return {}
        return {"0": dataclasses.asdict(config)}

    def version(self) -> str:
        return str(vllm.__version__)

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

    def stats(self) -> dict[str, Any]:
        sim = self.sim_t or 1.0
        wall = self.wall_s or 1.0
        return {
            "steps": self.steps,
            "wall_s": round(self.wall_s, 3),
            "setup_s": round(self.setup_s, 3),
            "sim_s": round(self.sim_t, 3),
            "steps_per_wall_s": round(self.steps / wall, 1),
            "sim_s_per_wall_s": round(self.sim_t / wall, 2),
            "requests_admitted": self.requests_admitted,
            "requests_finished": self.metrics.finished,
            "max_running": self.max_running,
            "scheduled_tokens": self.scheduled_tokens,
            "preemptions": self.preemptions,
            "requests_ever_preempted": len(self.ever_preempted),
            "idle_s": round(self.idle_s, 3),
            "idle_periods": self.idle_periods,
            "batches_published": self.batches_published,
            "events": sum(self.events.values()),
            "block_stored_events": self.events["BlockStored"],
            "block_stored_hashes": self.stored_hashes,
            "block_removed_events": self.events["BlockRemoved"],
            "block_removed_hashes": self.removed_hashes,
            "all_blocks_cleared_events": self.events["AllBlocksCleared"],
            "all_blocks_cleared_seqs": list(self.cleared_seqs),
            "events_per_sim_s": round(sum(self.events.values()) / sim, 2),
            "batches_per_sim_s": round(self.batches_published / sim, 2),
        }

    def sidecar(self) -> dict[str, Any]:
        """The JSON beside a recording (see kvscope/data/FORMAT.md)."""
        e, w = self.engine, self.workload_spec
        data: dict[str, Any] = {}
        if self.record_path is not None:
            data["capture_file"] = self.record_path.name
            data["capture_format"] = CAPTURE_FORMAT
            if self.record_path.exists():
                raw = self.record_path.read_bytes()
                data["capture_sha256"] = hashlib.sha256(raw).hexdigest()
                data["capture_bytes"] = len(raw)
        if self.recorder is not None:
            data["subscriber"] = self.recorder.summary()
        data["replica"] = self.name
        data["versions"] = {
            "vllm": str(vllm.__version__),
            "torch": str(torch.__version__),
            "python": platform.python_version(),
            "kvscope": __version__,
        }
        data["scheduler"] = {
            "cls": f"{Scheduler.__module__}.{Scheduler.__qualname__}",
            "async_scheduling": False,
            "block_size": e.block_size,
            "num_gpu_blocks": e.num_blocks,
            "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "max_model_len": e.max_model_len,
            "enable_prefix_caching": True,
            "chunked_prefill": True,
            "hash_algo": self.vllm_config.cache_config.prefix_caching_hash_algo,
            "kv_events_use_int_block_hashes": bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES),
            "publisher": "zmq",
            "endpoint": self.endpoint,
            "topic": e.topic,
            "replay_endpoint": None if self.replay_port is None else f"tcp://*:{self.replay_port}",
            "buffer_steps": e.buffer_steps,
        }
        data["workload"] = {
            "rate": w.rate,
            "duration": w.duration,
            "seed": w.seed,
            "stream": self.stream,
            "num_sys": w.num_sys,
            "sys_prompt_lens": self.workload.sys_prompt_lens,
            "sys_prompt_len": list(w.sys_prompt_len),
            "suffix_len": list(w.suffix_len),
            "out_len": list(w.out_len),
            "zipf_s": w.zipf_s,
            "vocab": w.vocab,
            "num_requests": self.requests_admitted,
            "step_time_model": e.step_time_model,
            "speed": self.speed,
        }
        data["clock"] = {"sim_epoch": self.sim_epoch, "ts_clock": "sim", "note": CLOCK_NOTE}
        data["resets"] = [r.as_json() for r in self.resets]
        data["ground_truth_note"] = GROUND_TRUTH_NOTE
        data["snapshots"] = list(self.snapshots)
        data["stats"] = self.stats()
        return data

    @property
    def sidecar_path(self) -> Path | None:
        return None if self.record_path is None else sidecar_path_for(self.record_path)

    # --- shutting down --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the loop, take a final snapshot, publish and record what is left, write files."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake.set()
        if self._driver is not None:
            self._driver.join(10.0)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command.future.set_running_or_notify_cancel():
                command.future.set_exception(ResetUnavailable(f"replica {self.name} closed"))
        recorder = self.recorder
        try:
            if self.http is not None:
                self.http.close()
            if self._ready and (self.steps or self.resets):
                self.snapshot("final")
            if self._ready and recorder is not None and not recorder.drain(self.last_seq):
                logger.warning("replica %s: the recorder did not receive every batch", self.name)
        finally:
            scheduler = getattr(self, "scheduler", None)
            if scheduler is not None:
                scheduler.shutdown()
            if recorder is not None:
                recorder.close()
            if self._ready and self.record_path is not None and recorder is not None:
                recorder.write(self.record_path)
                sidecar = sidecar_path_for(self.record_path)
                sidecar.write_text(json.dumps(self.sidecar(), indent=1) + "\n")
            shutil.rmtree(self._model_dir, ignore_errors=True)

    def __enter__(self) -> LabReplica:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def sidecar_path_for(capture: Path) -> Path:
    """`X.msgpack.gz` -> `X.json`; any other name gets `.json` appended."""
    name = capture.name
    if name.endswith(".msgpack.gz"):
        return capture.with_name(name[: -len(".msgpack.gz")] + ".json")
    return capture.with_name(name + ".json")
