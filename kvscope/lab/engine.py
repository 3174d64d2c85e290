"""One simulated engine (one DP rank): vLLM's real v1 `Scheduler` with no model behind it.

What is real (vLLM's own code): the `Scheduler` (chunked prefill, preemption, prefix-cache
lookups), its `KVCacheManager` and `BlockPool` (prefix caching, LRU eviction, KV events), its
`ZmqEventPublisher` (PUB + replay ROUTER, at most one batch per step), `reset_prefix_cache`
and `SchedulerStats`. What is simulated: the model runner (one token per scheduled request
that has finished its prefill, none for a partial prefill chunk: random, or for a greedy request
a function of its last token, so that twins write the same blocks), the batch `ts` (the caller's
clock, see `kvscope.lab.clock`), and the proposed keep-running reset
(`kvscope.lab.keep_reset`).

    engine = Engine(EngineSettings(num_blocks=64), port=0, replay_port=0)
    engine.add_request("r-0", prompt, max_tokens=16, arrival_ts=ts)
    step = engine.schedule()              # what this step runs
    engine.finish_step(step, ts + 0.03)   # the model's tokens; the step's batch is published
    engine.reset(ResetMode.KEEP)          # between steps
    engine.truth_counts()                 # BlockPool.cached_block_hash_to_block, as ints

The lab's driving loop (`kvscope.lab.driver`) drives it, and the tests through the lab.
Importing this module imports vLLM (slow).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched import scheduler as scheduler_module
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from kvscope.lab import clock
from kvscope.lab.engine_build import build_scheduler, write_model
from kvscope.lab.keep_reset import keep_running_reset
from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import ResetMode

HASH_MASK = (1 << 64) - 1
TruthCounts = dict[tuple[int, int], int]
"""(int block hash, KV cache group) -> physical copies: the shape of `PrefixMap.counts()`."""
BatchObserver = Callable[[int, KVEventBatch], None]
"""Called on the driving thread with (seq, batch) as each batch is handed to the publisher."""


def int_hash(value: object) -> int:
    """vLLM's external int form of a block hash (what `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`
    sends, and what the collector reduces bytes hashes to)."""
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & HASH_MASK
    assert isinstance(value, int)
    return value & HASH_MASK


@dataclass
class Step:
    """What one `schedule()` chose, before the model runs."""

    output: SchedulerOutput
    tokens: int
    requests: int
    preempted: set[str]
    """Every request preempted since the last step (by the scheduler or by a reset)."""
    kv_full_preempted: set[str]
    """Of those, the ones the scheduler preempted for want of KV cache blocks."""


@dataclass
class StepResult:
    outputs: list[EngineCoreOutput]
    scheduler_stats: SchedulerStats | None


@dataclass
class ResetOutcome:
    success: bool
    preempted: list[str]
    """The requests the reset preempted (they restart: their computed tokens are lost)."""
    clear_queued: bool
    """An AllBlocksCleared waits to go out with the next step's batch."""


@dataclass
class Published:
    """What the publisher was handed (the collector's view of the engine)."""

    batches: int = 0
    """Batches published; the last one has seq `batches - 1`."""
    events: Counter[str] = field(default_factory=Counter)
    """Events published, by type."""
    stored_hashes: int = 0
    removed_hashes: int = 0
    cleared_seqs: list[int] = field(default_factory=list)
    """The seqs of the batches that carried an AllBlocksCleared."""

    def count(self, seq: int, batch: KVEventBatch) -> None:
        for event in batch.events:
            self.events[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                self.stored_hashes += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.removed_hashes += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.cleared_seqs.append(seq)


class Engine:
    """One simulated engine. See the module docstring."""

    def __init__(
        self,
        settings: EngineSettings | None = None,
        *,
        port: int = 0,
        replay_port: int | None = 0,
        rank: int = 0,
        vocab: int = 32_000,
        token_seed: str = "kvscope-lab-tokens",
        publish_to: str | None = None,
    ) -> None:
        """Build the scheduler and bind its publisher (`port` + `rank`, `replay_port` + `rank`;
        0: chosen by the OS; `replay_port` None: no replay socket), or connect it to
        `publish_to` (a fleet's bound address). Nothing is published yet."""
        self.settings = settings or EngineSettings()
        self.rank = rank
        self.vocab = vocab
        self._model_dir = Path(tempfile.mkdtemp(prefix="kvscope-lab-model-"))
        try:
            write_model(self._model_dir)
            built = build_scheduler(
                self.settings, self._model_dir, port, replay_port, rank, publish_to=publish_to
            )
        except BaseException:
            shutil.rmtree(self._model_dir, ignore_errors=True)
            raise
        self.scheduler = built.scheduler
        self.vllm_config = built.config
        self.port = built.port
        self.replay_port = built.replay_port
        self.block_pool: BlockPool = self.scheduler.kv_cache_manager.block_pool
        hash_fn = get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(
            self.settings.block_size, hash_fn, self.vllm_config.num_hash_lookahead_tokens
        )
        """What new requests hash their blocks with (a test may wrap it to watch the chains)."""
        self.published = Published()
        self.batch_observers: list[BatchObserver] = []
        self.clear_observers: list[Callable[[int], None]] = []
        """Called with a batch's seq for each AllBlocksCleared it carries, before it is sent."""
        self._token_rng = random.Random(token_seed)
        self._greedy: set[str] = set()
        self._reset_preempted: set[str] = set()
        self._closed = False
        clock.install(scheduler_module)
        publisher = self.scheduler.kv_event_publisher
        self._publish = publisher.publish
        # Every batch the scheduler publishes passes through _on_publish first.
        setattr(publisher, "publish", self._on_publish)  # noqa: B010

    # --- requests -------------------------------------------------------------------------------
    def make_request(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_tokens: int,
        arrival_ts: float | None = None,
    ) -> Request:
        """A request as the engine core builds it (hashed with `block_hasher`), not added."""
        params = SamplingParams(max_tokens=max_tokens)
        params.update_from_generation_config({}, eos_token_id=None)
        return Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival_ts,
            block_hasher=self.block_hasher,
        )

    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_tokens: int,
        arrival_ts: float | None = None,
        greedy: bool = False,
    ) -> Request:
        request = self.make_request(request_id, prompt, max_tokens, arrival_ts)
        if greedy:
            self._greedy.add(request_id)
        self.scheduler.add_request(request)
        return request

    def abort(self, request_ids: Iterable[str]) -> None:
        """As the API server aborts requests (a client went away): their blocks are freed."""
        ids = list(request_ids)
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        self._greedy.difference_update(ids)

    # --- steps ----------------------------------------------------------------------------------
    def schedule(self) -> Step:
        output = self.scheduler.schedule()
        preempted = set(output.preempted_req_ids or ())
        kv_full = preempted - self._reset_preempted
        self._reset_preempted.clear()
        return Step(
            output,
            output.total_num_scheduled_tokens,
            len(output.num_scheduled_tokens),
            preempted,
            kv_full,
        )

    def finish_step(self, step: Step, ts: float) -> StepResult:
        """The model ran `step`: its tokens go back to the scheduler, which publishes the step's
        events as one batch stamped `ts`."""
        req_ids = list(step.output.num_scheduled_tokens)
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[self._sample(rid) for rid in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        with clock.stamping(ts):
            outputs = self.scheduler.update_from_output(step.output, runner_output)
        result = StepResult([], None)
        for eco in outputs.values():
            result.outputs.extend(eco.outputs)
            if eco.scheduler_stats is not None:
                result.scheduler_stats = eco.scheduler_stats
        for output in result.outputs:
            if output.finish_reason is not None:
                self._greedy.discard(output.request_id)
        return result

    def _sample(self, request_id: str) -> list[int]:
        request = self.scheduler.requests[request_id]
        # A partial prefill chunk samples nothing; any other scheduled request one token.
        if request.num_computed_tokens < request.num_tokens:
            return []
        if request_id in self._greedy:
            return [(request.all_token_ids[-1] * 1_103_515_245 + 12_345) % self.vocab]
        return [self._token_rng.randrange(self.vocab)]

    def _on_publish(self, batch: KVEventBatch) -> None:
        seq = self.published.batches
        self.published.batches += 1
        self.published.count(seq, batch)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                for on_clear in self.clear_observers:
                    on_clear(seq)
        for observer in self.batch_observers:
            observer(seq, batch)
        self._publish(batch)

    # --- resets ---------------------------------------------------------------------------------
    def reset(self, mode: ResetMode, reset_external: bool = False) -> ResetOutcome:
        """`POST /reset_prefix_cache` in `mode`, between steps.

        default: fails (and emits nothing) while any block is held. preempt
        (`reset_running_requests`): every running request is preempted first, then the reset.
        keep (`keep_running_requests`, proposed): `keep_running_reset`.
        """
        scheduler = self.scheduler
        running = [r.request_id for r in scheduler.running]
        queued = self.pending_clears
        if mode is ResetMode.KEEP:
            success = keep_running_reset(scheduler, reset_external)
        else:
            success = scheduler.reset_prefix_cache(
                reset_running_requests=mode is ResetMode.PREEMPT, reset_connector=reset_external
            )
        still_running = {r.request_id for r in scheduler.running}
        preempted = [rid for rid in running if rid not in still_running]
        self._reset_preempted.update(preempted)
        return ResetOutcome(bool(success), preempted, self.pending_clears > queued)

    # --- state ----------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int | None:
        """The seq of the last batch handed to the publisher."""
        return self.published.batches - 1 if self.published.batches else None

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
    def pending_clears(self) -> int:
        return sum(isinstance(e, AllBlocksCleared) for e in self.block_pool.kv_event_queue)

    @property
    def pending_events(self) -> int:
        """KV events emitted but not yet published (they go out with the next step)."""
        return len(self.block_pool.kv_event_queue)

    def truth_counts(self) -> TruthCounts:
        """BlockPool.cached_block_hash_to_block, hash for hash, copy for copy (the ground truth)."""
        counts: TruthCounts = {}
        for key, blocks in self.block_pool.cached_block_hash_to_block._cache.items():
            copies = len(blocks) if isinstance(blocks, dict) else 1
            block_hash = int_hash(maybe_convert_block_hash(get_block_hash(key)))
            counts[(block_hash, get_group_id(key))] = copies
        return counts

    def event_sources(self) -> dict[str, dict[str, Any]]:
        """`GET /kv_event_sources`: this rank's publisher config, as vLLM resolved it."""
        config = self.scheduler.get_kv_event_publisher_config()
        if config is None:
            return {}
        return {str(self.rank): dataclasses.asdict(config)}

    def close(self) -> None:
        """Shut the publisher down (it sends what it was handed first)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.scheduler.shutdown()
        finally:
            shutil.rmtree(self._model_dir, ignore_errors=True)
