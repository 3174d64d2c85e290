"""vLLM's own KV event source for the tests: a lab replica stepped by the test, and references.

The collector is only as good as the map it rebuilds, and the only authority on that map is
vLLM's `BlockPool`. A `Source` is a `LabReplica` (kvscope.lab: vLLM's real Scheduler,
KVCacheManager, BlockPool and ZmqEventPublisher on CPU, no model) that the test steps
one engine step at a time, under a load that makes every case the map must follow (shared
prefixes, eviction, preemption, twins and block-aligned prompts that cache a hash twice) and,
with `ResetOdds`, resets in every mode between steps:

    source = Source.start(port=p, replay_port=r, seed=7, resets=ResetOdds(keep=0.04))
    source.step()                         # one engine step (maybe a reset first)
    source.truth_counts()                 # {(int hash, group): copies}, the collector's shape
    reference_stats(source.truth_counts(), source.parents)

Importing it imports vLLM (slow).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import zmq

from kvscope.lab.engine import TruthCounts, int_hash
from kvscope.lab.replica import LabReplica
from kvscope.lab.report import ResetRecord
from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import ResetMode, WorkloadSpec
from kvscope.storage.scrape import parse_vllm_metrics

TEST_LOAD = WorkloadSpec(
    rate=10.0,
    num_sys=3,
    sys_prompt_len=(16, 72),
    suffix_len=(0, 40),
    out_len=(4, 56),
    zipf_s=0.0,
    twin_prob=0.15,
    aligned_prob=0.2,
    greedy_prob=0.4,
)
"""Short prompts over three shared system prompts, more arrivals than six running requests
serve (the engine is never idle for long), twins, block-aligned prompts, greedy decoding."""


def small_engine(num_blocks: int = 64, buffer_steps: int = 10_000) -> EngineSettings:
    """A small KV cache (eviction, preemption) and 12 requests at most, topic ""."""
    return EngineSettings(
        num_blocks=num_blocks, max_num_seqs=12, buffer_steps=buffer_steps, topic=""
    )


# --- references ---------------------------------------------------------------------------------
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


# --- the source ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResetOdds:
    """The chance, before each step, of a reset in each mode."""

    default: float = 0.0
    preempt: float = 0.0
    keep: float = 0.0
    idle: float = 0.0
    """Every running request is aborted, then a default reset, which then succeeds."""


class Source:
    """A lab replica stepped by the test, with random resets. See the module docstring."""

    def __init__(self, replica: LabReplica, seed: int, resets: ResetOdds) -> None:
        self.replica = replica
        self.odds = resets
        self.rng = random.Random(f"kvscope-test-resets/{seed}")
        self.stats: Counter[str] = Counter()
        self.parents: dict[int, int | None] = {}
        """int hash -> int hash of its parent block (None for a first block), for every hash
        any request ever computed: the chains behind `reference_stats`."""
        engine = replica.engine
        engine.block_hasher = self._noting_parents(engine.block_hasher)

    @classmethod
    def start(
        cls,
        num_blocks: int = 64,
        port: int = 0,
        replay_port: int | None = 0,
        rank: int = 0,
        buffer_steps: int = 10_000,
        seed: int = 0,
        resets: ResetOdds | None = None,
        name: str = "req",
        load: WorkloadSpec = TEST_LOAD,
        http_port: int | None = None,
    ) -> Source:
        """A replica publishing on `port` + `rank` (replay: `replay_port` + `rank`); with
        `http_port` (0: any), serving the lab's vLLM-shaped HTTP API too."""
        replica = LabReplica(
            name,
            replace(load, seed=seed),
            small_engine(num_blocks, buffer_steps),
            rank=rank,
            port=port,
            replay_port=replay_port,
            http_port=http_port,
            snapshot_every=None,
        )
        return cls(replica, seed, resets or ResetOdds())

    def _noting_parents(self, hasher: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
        parents = self.parents

        def hash_blocks(request: Any) -> list[Any]:
            new = hasher(request)
            previous = request.block_hashes[-1] if request.block_hashes else None
            for block_hash in new:
                parents[int_hash(block_hash)] = None if previous is None else int_hash(previous)
                previous = block_hash
            return new

        return hash_blocks

    # --- what the collector is compared with ----------------------------------------------------
    @property
    def batches(self) -> int:
        """Batches published so far; the last one has seq `batches - 1`."""
        return self.replica.batches_published

    @property
    def last_seq(self) -> int | None:
        return self.replica.last_seq

    @property
    def events(self) -> Counter[str]:
        """Events published, by type."""
        return self.replica.events

    def truth_counts(self) -> TruthCounts:
        return self.replica.truth_counts()

    @property
    def prefix_cache_hits(self) -> float:
        """Prompt tokens found in the prefix cache (vLLM's own counter)."""
        (engine,) = parse_vllm_metrics(self.replica.metrics_text().decode(), ts=0.0)
        return engine.prefix_cache_hits or 0.0

    # --- steps and resets -----------------------------------------------------------------------
    def step(self) -> None:
        """One engine step, after a reset in a mode the odds pick (if any)."""
        roll = self.rng.random()
        for chance, reset in (
            (self.odds.default, self.reset_default),
            (self.odds.preempt, self.reset_preempt),
            (self.odds.keep, self.reset_keep_running),
            (self.odds.idle, self.reset_idle),
        ):
            if roll < chance:
                reset(step=False)
                break
            roll -= chance
        self.replica.step()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def reset_default(self, step: bool = True) -> bool:
        """`POST /reset_prefix_cache`: fails (and emits nothing) while any block is held.
        With `step`, the next engine step runs (and publishes the clear)."""
        ok = self._reset(ResetMode.DEFAULT, step).result
        self.stats["reset_default_ok" if ok else "reset_default_failed"] += 1
        return ok

    def reset_preempt(self, step: bool = True) -> None:
        """`reset_running_requests=true`: preempt every running request, then reset."""
        assert self._reset(ResetMode.PREEMPT, step).result
        self.stats["reset_preempt"] += 1

    def reset_keep_running(self, step: bool = True) -> None:
        """The keep-running reset: running requests keep their blocks and continue."""
        record = self._reset(ResetMode.KEEP, step)
        self.stats["reset_keep"] += 1
        self.stats["reset_keep_with_running"] += record.running_before > 0

    def reset_idle(self, step: bool = True) -> None:
        """Every running request is aborted, then a default reset, which now succeeds."""
        self.replica.abort_running()
        assert self.reset_default(step), "a reset with no running request must succeed"

    def _reset(self, mode: ResetMode, step: bool) -> ResetRecord:
        record = self.replica.reset(mode)
        if step:
            self.replica.step()
        return record

    def close(self) -> None:
        self.replica.close()


# --- a lossy hop between publisher and collector ------------------------------------------------
class LossyForwarder:
    """A ZMQ SUB -> PUB proxy thread on loopback that drops the batches whose seq `drop` picks.

    It subscribes to the publisher (`upstream`, e.g. `tcp://127.0.0.1:5557`) and republishes on
    `downstream` (e.g. `tcp://127.0.0.1:6000`, bound here) for the collector to connect to. The
    collector's replay endpoint should point at the publisher itself, which still has every batch.
    `connect_mode`: the other way round, as in a fleet: it binds `upstream` (the publisher
    connects to it) and connects to `downstream` (the collector's bound address).
    """

    def __init__(
        self,
        upstream: str,
        downstream: str,
        drop: Callable[[int], bool],
        connect_mode: bool = False,
    ) -> None:
        self.connect_mode = connect_mode
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
            if self.connect_mode:  # no handshake to wait for: the publisher connects later
                sub.bind(self.upstream)
                pub.connect(self.downstream)
                self._ready.set()
            else:
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
