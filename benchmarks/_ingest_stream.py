"""benchmarks/ingest.py's stream: what vLLM 0.33's BlockPool publishes (a small scheduler model).

See benchmarks/ingest.py's docstring for what it models; benchmarks/store.py stores the same stream.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

BLOCK_SIZE = 16
VOCAB = 128_000
TOKEN_POOL = 16_384
"""Distinct 16-token blocks drawn once; a block's tokens are picked from them by its hash."""
EPOCH = 1_796_051_000.0
STEP_S = 0.02
"""Simulated seconds per engine step (the batch `ts`)."""
H200_BLOCK_EVENTS_PER_S = 2_500
"""A replica on an H200 under load (the issue's figure)."""

MAX_RUNNING = 24
ARRIVAL_P = 0.35
"""Chance per step (repeated) that a request arrives while fewer than MAX_RUNNING run."""
SYSTEM_PROMPTS = 8
PROMPT_SHARE = 0.8
"""Share of requests that start with one of the system prompts."""
MAX_CHUNK_BLOCKS = 32
"""Blocks one chunked-prefill step of one request can fill."""
DECODE_BLOCK_P = 1 / BLOCK_SIZE
"""A decoding request fills a block every BLOCK_SIZE steps on average."""


# --- vLLM 0.33's wire structs (vllm/distributed/kv_events.py), field for field -----------------
class VllmBlockStored(
    msgspec.Struct, omit_defaults=True, gc=False, tag="BlockStored", tag_field="type"
):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class VllmBlockRemoved(
    msgspec.Struct, omit_defaults=True, gc=False, tag="BlockRemoved", tag_field="type"
):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class VllmAllBlocksCleared(
    msgspec.Struct, omit_defaults=True, gc=False, tag="AllBlocksCleared", tag_field="type"
):
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


# --- the stream ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Request:
    pending: list[int]
    """Hashes still to store by prefill, in chain order."""
    decode_blocks: int
    """Blocks still to fill by decoding."""
    tail: int | None = None
    held: list[int] = field(default_factory=list)
    """Cached hashes this request holds (prefix hits and its own blocks), chain order."""


@dataclass
class StreamStats:
    batches: int = 0
    stores: int = 0
    removals: int = 0
    clears: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    payload_bytes: int = 0
    events_per_batch: Counter[int] = field(default_factory=Counter)
    final_cached: int = 0

    @property
    def block_events(self) -> int:
        return self.stored_blocks + self.removed_blocks


class _Engine:
    """Just enough of vLLM's scheduler and BlockPool to publish a realistic event stream."""

    def __init__(self, rng: random.Random, capacity: int, clear_every: int) -> None:
        self.rng = rng
        self.capacity = capacity
        self.clear_every = clear_every
        self.pool = [[rng.randrange(VOCAB) for _ in range(BLOCK_SIZE)] for _ in range(TOKEN_POOL)]
        self.prompts = [
            [rng.getrandbits(64) for _ in range(rng.randint(4, 64))] for _ in range(SYSTEM_PROMPTS)
        ]
        self.prompt_weights = [1 / (k + 1) for k in range(SYSTEM_PROMPTS)]
        self.cached: dict[int, int] = {}
        """Cached hash -> running requests holding it."""
        self.free: OrderedDict[int, None] = OrderedDict()
        """Cached hashes nobody holds, least recently freed first: what allocation evicts."""
        self.running: list[_Request] = []
        self.ts = EPOCH
        self.since_clear = 0
        self.stats = StreamStats()

    def step(self) -> list[VllmEvent]:
        """One engine step; its events in publishing order (maybe none)."""
        rng = self.rng
        self.ts += STEP_S
        events: list[VllmEvent] = []
        if self.since_clear >= self.clear_every:
            events.append(VllmAllBlocksCleared())
            self.stats.clears += 1
            self.since_clear = 0
            self.cached.clear()
            self.free.clear()
            self.running.clear()
        while len(self.running) < MAX_RUNNING and rng.random() < ARRIVAL_P:
            self.running.append(self._arrive())
        plan: list[tuple[_Request, list[int]]] = []
        finished: list[_Request] = []
        for req in self.running:
            if req.pending:
                chunk = req.pending[:MAX_CHUNK_BLOCKS]
                del req.pending[:MAX_CHUNK_BLOCKS]
                # Blocks of a system prompt another request cached meanwhile are hits now.
                while chunk and chunk[0] in self.cached:
                    self._hold(req, chunk.pop(0))
                if chunk:
                    plan.append((req, chunk))
            elif req.decode_blocks and rng.random() < DECODE_BLOCK_P:
                req.decode_blocks -= 1
                plan.append((req, [rng.getrandbits(64)]))
            elif not req.decode_blocks:
                finished.append(req)
        for req in finished:
            self._finish(req)
        needed = sum(len(chunk) for _, chunk in plan)
        over = len(self.cached) + needed - self.capacity
        while over > 0 and self.free:
            block_hash = self.free.popitem(last=False)[0]
            del self.cached[block_hash]
            events.append(VllmBlockRemoved(block_hashes=[block_hash], medium="GPU", group_idx=0))
            over -= 1
        for req, chunk in plan:
            events.append(self._stored(req.tail, chunk))
            for block_hash in chunk:
                self.cached[block_hash] = 1
            req.held.extend(chunk)
            req.tail = chunk[-1]
        self._count(events)
        return events

    def _arrive(self) -> _Request:
        rng = self.rng
        prompt: list[int] = []
        if rng.random() < PROMPT_SHARE:
            prompt = rng.choices(self.prompts, self.prompt_weights)[0]
        hit = 0
        while hit < len(prompt) and prompt[hit] in self.cached:
            hit += 1
        own = [rng.getrandbits(64) for _ in range(rng.randint(0, 40))]
        req = _Request(pending=prompt[hit:] + own, decode_blocks=rng.randint(0, 24))
        for block_hash in prompt[:hit]:
            self._hold(req, block_hash)
        return req

    def _hold(self, req: _Request, block_hash: int) -> None:
        if self.cached[block_hash] == 0:
            del self.free[block_hash]
        self.cached[block_hash] += 1
        req.held.append(block_hash)
        req.tail = block_hash

    def _finish(self, req: _Request) -> None:
        """vLLM frees a request's blocks tail first: its last block is evicted first."""
        self.running.remove(req)
        for block_hash in reversed(req.held):
            users = self.cached[block_hash] - 1
            self.cached[block_hash] = users
            if not users:
                self.free[block_hash] = None

    def _stored(self, parent: int | None, hashes: list[int]) -> VllmBlockStored:
        pool = self.pool
        tokens: list[int] = []
        for block_hash in hashes:
            tokens += pool[block_hash % TOKEN_POOL]
        return VllmBlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=BLOCK_SIZE,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None] * len(hashes),
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )

    def _count(self, events: list[VllmEvent]) -> None:
        s = self.stats
        before = s.block_events
        for event in events:
            if type(event) is VllmBlockStored:
                s.stores += 1
                s.stored_blocks += len(event.block_hashes)
            elif type(event) is VllmBlockRemoved:
                s.removals += 1
                s.removed_blocks += len(event.block_hashes)
        self.since_clear += s.block_events - before


def make_stream(
    block_events: int, seed: int, cached: int, clear_every: int
) -> tuple[list[bytes], StreamStats]:
    """Encoded KVEventBatch payloads worth at least `block_events` block-events."""
    engine = _Engine(random.Random(seed), cached, clear_every)
    encode = msgspec.msgpack.Encoder().encode
    payloads: list[bytes] = []
    stats = engine.stats
    while stats.block_events < block_events:
        events = engine.step()
        if not events:
            continue  # vLLM publishes nothing for a step without events
        payload = encode(VllmEventBatch(ts=engine.ts, events=events, data_parallel_rank=0))
        payloads.append(payload)
        stats.batches += 1
        stats.payload_bytes += len(payload)
        stats.events_per_batch[len(events)] += 1
    stats.final_cached = len(engine.cached)
    return payloads, stats
