"""vLLM's own KV event source on CPU: a real KVCacheManager, a workload, a real ZmqEventPublisher.

The collector is only as good as the map it rebuilds, and the only authority on that map is
vLLM's `BlockPool`. This module drives the real thing without a model or a GPU, the way vLLM's
`tests/v1/core/test_prefix_caching.py` does, publishes what it emits over ZMQ exactly as the
engine core does (at most one batch per step), and reads the ground truth back out of the pool:

    source = EventSource.start(num_blocks=64, port=p, replay_port=r)
    workload = Workload(source.manager, random.Random(7), flush=source.flush)
    workload.step()                       # one engine step: decode, admit, maybe reset
    truth_counts(source.manager)          # {(int hash, group): copies}, the collector's shape

Used by `tests/test_vllm_integration.py` and by the lab. Importing it imports vLLM (slow: ~6 s).
"""

from __future__ import annotations

import errno
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    KVEventBatch,
    ZmqEventPublisher,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockHashToBlockMap
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request, RequestStatus

BLOCK_SIZE = 16
HASH_MASK = (1 << 64) - 1
MAX_MODEL_LEN = 8192

TruthCounts = dict[tuple[int, int], int]
"""(int block hash, KV cache group) -> physical copies: the shape of `PrefixMap.counts()`."""


# --- hashes and ground truth ----------------------------------------------------------------------
def int_hash(block_hash: bytes) -> int:
    """vLLM's external int form of a block hash (what `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`
    sends, and what the collector reduces bytes hashes to)."""
    return int.from_bytes(block_hash, "big") & HASH_MASK


def truth_counts(manager: KVCacheManager) -> TruthCounts:
    """The BlockPool's prefix-cache map, hash for hash, copy for copy."""
    counts: TruthCounts = {}
    for key, blocks in manager.block_pool.cached_block_hash_to_block._cache.items():
        copies = len(blocks) if isinstance(blocks, dict) else 1
        counts[(int_hash(get_block_hash(key)), get_group_id(key))] = copies
    return counts


@dataclass(frozen=True, slots=True)
class ReferenceStats:
    """What `PrefixMap.totals()` should say, computed from the ground truth and the hash chains."""

    blocks: int
    copies: int
    hittable: int
    orphans: int


def reference_stats(truth: TruthCounts, parents: Mapping[int, int | None]) -> ReferenceStats:
    """Orphans: cached blocks whose parent is not cached. Hittable: every ancestor cached."""
    hittable_memo: dict[tuple[int, int], bool] = {}

    def hittable(key: tuple[int, int]) -> bool:
        chain: list[tuple[int, int]] = []
        result = True
        while key not in hittable_memo:
            if key not in truth:
                result = False
                break
            chain.append(key)
            parent = parents[key[0]]
            if parent is None:
                break
            key = (parent, key[1])
        else:
            result = hittable_memo[key]
        for k in chain:
            hittable_memo[k] = result
        return result

    orphans = 0
    for block_hash, group in truth:
        parent = parents[block_hash]
        if parent is not None and (parent, group) not in truth:
            orphans += 1
    return ReferenceStats(
        blocks=len(truth),
        copies=sum(truth.values()),
        hittable=sum(1 for key in truth if hittable(key)),
        orphans=orphans,
    )


def diff_counts(got: Mapping[tuple[int, int], int], want: Mapping[tuple[int, int], int]) -> str:
    """A short, readable account of how two count maps differ (for assertion messages)."""
    lines = [
        f"got {len(got)} hashes / {sum(got.values())} copies, "
        f"want {len(want)} / {sum(want.values())}"
    ]
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    wrong = [k for k in want if k in got and got[k] != want[k]]
    for label, keys in (("missing", missing), ("extra", extra), ("wrong count", wrong)):
        if keys:
            shown = ", ".join(
                f"{h:#018x}/g{g}: got {got.get((h, g), 0)} want {want.get((h, g), 0)}"
                for h, g in keys[:5]
            )
            lines.append(f"{len(keys)} {label}: {shown}")
    return "; ".join(lines)


# --- the manager --------------------------------------------------------------------------------
def make_kv_cache_config(num_blocks: int, block_size: int = BLOCK_SIZE) -> KVCacheConfig:
    """One KV cache group of full attention, no tensors (as vLLM's prefix-caching tests do)."""
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )


def make_manager(num_blocks: int, block_size: int = BLOCK_SIZE) -> KVCacheManager:
    """vLLM's KVCacheManager on CPU with prefix caching and KV events on (sha256 hashes)."""
    init_none_hash(sha256)
    return KVCacheManager(
        make_kv_cache_config(num_blocks, block_size),
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
        enable_kv_cache_events=True,
    )


def make_request(
    request_id: str, prompt: list[int], max_tokens: int, block_size: int = BLOCK_SIZE
) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    params.update_from_generation_config({}, eos_token_id=None)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def reset_keep_running(manager: KVCacheManager) -> None:
    """The proposed `keep_running_requests` reset, which no vLLM release has.

    Every hash leaves the lookup and every block forgets its hash, but held blocks stay in the
    running requests' block tables: those requests continue, and their next full blocks are
    stored with a parent that is no longer cached. Their old blocks, when later reused, emit no
    BlockRemoved (they have no hash any more).
    """
    pool = manager.block_pool
    pool.cached_block_hash_to_block = BlockHashToBlockMap()  # type: ignore[no-untyped-call]
    pool.cached_block_hashes_by_block.clear()
    for block in pool.blocks:
        block.reset_hash()  # type: ignore[no-untyped-call]
    if pool.enable_kv_cache_events:
        pool.kv_event_queue.append(AllBlocksCleared())


# --- ports and the publisher --------------------------------------------------------------------
def _can_bind(port: int) -> bool:
    # SO_REUSEADDR as libzmq sets it, so a port in TIME_WAIT counts as free.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port nothing listens on (bind port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(length: int, exclude: Iterable[int] = ()) -> int:
    """A port p with p .. p+length-1 all free: vLLM adds the DP rank to the base port."""
    taken = set(exclude)
    for _ in range(200):
        base = free_port()
        run = range(base, base + length)
        if base + length < 65536 and not taken & set(run) and all(map(_can_bind, run)):
            return base
    raise RuntimeError(f"no run of {length} free ports found")


def wait_port_free(port: int, timeout: float = 5.0) -> None:
    """libzmq closes a listener asynchronously: wait until a closed publisher's port is free."""
    deadline = time.monotonic() + timeout
    while not _can_bind(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} still in use after {timeout} s")
        time.sleep(0.02)


def make_publisher(
    port: int,
    replay_port: int | None,
    rank: int = 0,
    buffer_steps: int = 10_000,
    topic: str = "",
    timeout: float = 5.0,
) -> ZmqEventPublisher:
    """vLLM's ZmqEventPublisher binding `tcp://*:port` (+ rank, which it adds itself)."""
    deadline = time.monotonic() + timeout
    while True:
        wait_port_free(port + rank, timeout)
        if replay_port is not None:
            wait_port_free(replay_port + rank, timeout)
        try:
            return ZmqEventPublisher(
                data_parallel_rank=rank,
                endpoint=f"tcp://*:{port}",
                replay_endpoint=None if replay_port is None else f"tcp://*:{replay_port}",
                buffer_steps=buffer_steps,
                topic=topic,
            )
        except zmq.ZMQError as exc:  # lost a race for the port; try again
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class EventSource:
    """One DP rank of an engine: its KVCacheManager and its publisher, with the seq it is at."""

    manager: KVCacheManager
    publisher: ZmqEventPublisher
    rank: int = 0
    batches: int = 0
    """Batches published so far; the last one has seq `batches - 1`."""
    events: Counter[str] = field(default_factory=Counter)
    """Events published, by type."""
    on_batch: Callable[[KVEventBatch], None] | None = None
    """Called with each batch before it is published (to look at what travels)."""
    _closed: bool = False

    @classmethod
    def start(
        cls,
        num_blocks: int,
        port: int,
        replay_port: int | None,
        rank: int = 0,
        buffer_steps: int = 10_000,
        topic: str = "",
    ) -> EventSource:
        manager = make_manager(num_blocks)
        publisher = make_publisher(port, replay_port, rank, buffer_steps, topic)
        return cls(manager, publisher, rank)

    @property
    def last_seq(self) -> int | None:
        return self.batches - 1 if self.batches else None

    def flush(self) -> int | None:
        """End of an engine step: publish what the manager emitted as one batch, if anything.

        Returns the batch's seq, or None when there was nothing to publish.
        """
        events: list[Any] = self.manager.take_events()
        if not events:
            return None
        for event in events:
            self.events[type(event).__name__] += 1
        batch = KVEventBatch(ts=time.time(), events=events)
        if self.on_batch is not None:
            self.on_batch(batch)
        self.publisher.publish(batch)
        self.batches += 1
        return self.batches - 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.publisher.shutdown()


# --- the workload -------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadConfig:
    system_prompts: int = 3
    system_prompt_tokens: tuple[int, int] = (16, 72)
    suffix_tokens: tuple[int, int] = (0, 40)
    aligned_prompt_prob: float = 0.2
    """Cut the prompt to whole blocks: vLLM recomputes its last block, storing a second copy."""
    twin_prob: float = 0.15
    """Repeat an earlier prompt exactly (with greedy decoding: duplicate decode blocks too)."""
    greedy_prob: float = 0.4
    """Decode tokens that depend only on the previous token, so twins write the same blocks."""
    output_tokens: tuple[int, int] = (4, 56)
    max_running: int = 6
    admit_prob: float = 0.7
    max_decode_per_step: int = 4
    vocab: int = 32_000
    reset_default_prob: float = 0.0
    reset_preempt_prob: float = 0.0
    reset_keep_prob: float = 0.0
    reset_idle_prob: float = 0.0
    """Let every running request finish at once, then reset: a default reset that succeeds."""


@dataclass
class _Live:
    request: Request
    target_tokens: int
    greedy: bool


class Workload:
    """A seeded, scheduler-like driver of a KVCacheManager.

    Each `step()` is one engine step: running requests decode 1..N tokens (new full blocks get
    cached; a request that cannot get a block preempts the newest running one), finished
    requests are freed (their blocks become evictable, LRU), waiting requests are admitted with
    their prefix-cache hit, and sometimes the prefix cache is reset. Then `flush` is called, so
    everything a step emits travels as one batch, as the engine core publishes it.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        rng: random.Random,
        config: WorkloadConfig | None = None,
        flush: Callable[[], object] | None = None,
        name: str = "req",
    ) -> None:
        self.manager = manager
        self.rng = rng
        self.config = config or WorkloadConfig()
        self.flush = flush
        self.name = name
        self.running: list[_Live] = []
        self.waiting: list[_Live] = []
        self.stats: Counter[str] = Counter()
        self.parents: dict[int, int | None] = {}
        """int hash -> int hash of its parent block (None for a first block), for every hash
        any request ever computed: the chains behind `reference_stats`."""
        self._noted: dict[str, int] = {}
        self._prompts: list[list[int]] = []
        self._next_id = 0
        lo, hi = self.config.system_prompt_tokens
        self.system_prompts = [
            [rng.randrange(self.config.vocab) for _ in range(rng.randint(lo, hi))]
            for _ in range(self.config.system_prompts)
        ]

    # --- one step -----------------------------------------------------------------------------
    def step(self) -> None:
        cfg, rng = self.config, self.rng
        roll = rng.random()
        for prob, action in (
            (cfg.reset_default_prob, self.reset_default),
            (cfg.reset_preempt_prob, self.reset_preempt),
            (cfg.reset_keep_prob, self.reset_keep_running),
            (cfg.reset_idle_prob, self.reset_idle),
        ):
            if roll < prob:
                action(flush=False)
                break
            roll -= prob
        self._decode()
        if rng.random() < cfg.admit_prob:
            self.waiting.append(self._new_request())
        self._admit()
        self._end_step()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    # --- resets (each is a step of its own unless flush=False) --------------------------------
    def reset_default(self, flush: bool = True) -> bool:
        """`POST /reset_prefix_cache`: fails (and emits nothing) while any block is held."""
        ok = self.manager.reset_prefix_cache()
        self.stats["reset_default_ok" if ok else "reset_default_failed"] += 1
        if flush:
            self._end_step()
        return ok

    def reset_preempt(self, flush: bool = True) -> None:
        """`reset_running_requests=true`: preempt every running request, then reset."""
        for live in reversed(list(self.running)):
            self._preempt(live)
        ok = self.manager.reset_prefix_cache()
        assert ok, "a reset with no running request must succeed"
        self.stats["reset_preempt"] += 1
        if flush:
            self._end_step()

    def reset_keep_running(self, flush: bool = True) -> None:
        """The keep-running reset: running requests keep their blocks and continue."""
        reset_keep_running(self.manager)
        self.stats["reset_keep"] += 1
        if self.running:
            self.stats["reset_keep_with_running"] += 1
        if flush:
            self._end_step()

    def reset_idle(self, flush: bool = True) -> None:
        """Every running request finishes now, then a default reset, which now succeeds."""
        for live in list(self.running):
            self._finish(live)
        ok = self.reset_default(flush=False)
        assert ok, "a reset with no running request must succeed"
        if flush:
            self._end_step()

    # --- internals ----------------------------------------------------------------------------
    def _new_request(self) -> _Live:
        cfg, rng = self.config, self.rng
        if self._prompts and rng.random() < cfg.twin_prob:
            prompt = list(rng.choice(self._prompts))
            self.stats["twin"] += 1
        else:
            prompt = list(rng.choice(self.system_prompts))
            prompt += [rng.randrange(cfg.vocab) for _ in range(rng.randint(*cfg.suffix_tokens))]
            if len(prompt) >= BLOCK_SIZE and rng.random() < cfg.aligned_prompt_prob:
                prompt = prompt[: len(prompt) // BLOCK_SIZE * BLOCK_SIZE]
        self._prompts.append(prompt)
        if len(self._prompts) > 64:
            self._prompts.pop(0)
        target = len(prompt) + rng.randint(*cfg.output_tokens)
        request_id = f"{self.name}-{self._next_id}"
        self._next_id += 1
        request = make_request(request_id, prompt, max_tokens=target - len(prompt))
        return _Live(request, target, greedy=rng.random() < cfg.greedy_prob)

    def _next_token(self, live: _Live) -> int:
        if live.greedy:
            last = live.request.all_token_ids[-1]
            return (last * 1_103_515_245 + 12_345) % self.config.vocab
        return self.rng.randrange(self.config.vocab)

    def _admit(self) -> None:
        manager = self.manager
        while self.waiting and len(self.running) < self.config.max_running:
            live = self.waiting[0]
            request = live.request
            computed, num_computed, _ = manager.get_computed_blocks(request)
            blocks = manager.allocate_slots(
                request, request.num_tokens - num_computed, num_computed, computed
            )
            if blocks is None:
                self.stats["admit_blocked"] += 1
                break  # FCFS: nothing jumps the queue
            self.waiting.pop(0)
            self.stats["hit_blocks"] += num_computed // BLOCK_SIZE
            self.stats["admitted"] += 1
            # The prefill ran: every token is computed and one token was sampled.
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = request.num_tokens
            request.append_output_token_ids(self._next_token(live))
            self.running.append(live)
            self._note(request)

    def _decode(self) -> None:
        manager = self.manager
        for live in list(self.running):
            request = live.request
            for _ in range(self.rng.randint(1, self.config.max_decode_per_step)):
                if live not in self.running:
                    break  # preempted to make room for an older request
                if request.num_tokens >= live.target_tokens:
                    break
                while manager.allocate_slots(request, 1) is None:
                    self._preempt(self.running[-1])
                    if live not in self.running:
                        break
                else:
                    request.num_computed_tokens += 1
                    request.append_output_token_ids(self._next_token(live))
                    self.stats["decoded"] += 1
            if live in self.running and request.num_tokens >= live.target_tokens:
                # The last sampled token is never computed: its KV is never written.
                self._finish(live)

    def _finish(self, live: _Live) -> None:
        self._note(live.request)
        self.manager.free(live.request)
        self.running.remove(live)
        live.request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self._noted.pop(live.request.request_id, None)
        self.stats["finished"] += 1

    def _preempt(self, live: _Live) -> None:
        """As vLLM's scheduler preempts: free the blocks, recompute everything later."""
        request = live.request
        self._note(request)
        self.manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.running.remove(live)
        self.waiting.insert(0, live)
        self.stats["preempted"] += 1

    def _note(self, request: Request) -> None:
        """Record the parent of every hash the request computed since it was last noted."""
        hashes = request.block_hashes
        start = self._noted.get(request.request_id, 0)
        parents = self.parents
        for i in range(start, len(hashes)):
            parents[int_hash(hashes[i])] = int_hash(hashes[i - 1]) if i else None
        self._noted[request.request_id] = len(hashes)

    def _end_step(self) -> None:
        for live in self.running:
            self._note(live.request)
        for live in self.waiting:
            self._note(live.request)
        if self.flush is not None:
            self.flush()


# --- a lossy hop between publisher and collector ------------------------------------------------
class LossyForwarder:
    """A ZMQ SUB -> PUB proxy thread on loopback that drops the batches whose seq `drop` picks.

    It subscribes to the publisher (`upstream`, e.g. `tcp://127.0.0.1:5557`) and republishes on
    `downstream` (e.g. `tcp://127.0.0.1:6000`, bound here) for the collector to connect to. The
    collector's replay endpoint should point at the publisher itself, which still has every batch.
    """

    def __init__(self, upstream: str, downstream: str, drop: Callable[[int], bool]) -> None:
        self.upstream = upstream
        self.downstream = downstream
        self.drop = drop
        self.forwarded: list[int] = []
        self.dropped: list[int] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lossy-forwarder", daemon=True)

    def start(self, timeout: float = 5.0) -> None:
        """Start, and return once the upstream connection is up and subscribed."""
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"forwarder could not connect to {self.upstream}")
        if self._error is not None:
            raise RuntimeError("forwarder failed") from self._error
        time.sleep(0.1)  # the subscription travels right after the handshake: let it land

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        pub = ctx.socket(zmq.PUB)
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(self.downstream)
            sub.connect(self.upstream)
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while not self._stop.is_set():
                for sock, _ in poller.poll(20):
                    if sock is monitor:
                        monitor.recv_multipart()
                        self._ready.set()
                        continue
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        seq = int.from_bytes(frames[1], "big") if len(frames) == 3 else -1
                        if self.drop(seq):
                            self.dropped.append(seq)
                        else:
                            self.forwarded.append(seq)
                            pub.send_multipart(frames)
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            pub.close(linger=0)
            ctx.term()
