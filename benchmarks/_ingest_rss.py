"""benchmarks/ingest.py's memory figures: resident bytes per cached block of a large map, in
memory only and with the store on.

The map is built in a fresh interpreter (this file run as a script), so that nothing else the
benchmark made is counted. With the store on, the same blocks come as vLLM's payloads through
`StreamIngest` into a `StoreWriter` on a SQLite file (the store's default settings, room for the
whole run in its queue), and RSS is read once the writer has written everything, the heap
trimmed as the writer does after a backlog (storage/heap_trim.py): what a collector that stores
holds for its map, its log's dictionary and its latest checkpoint's known hashes.

Two ways of feeding the store: `--keep-up` waits for the writer after each take's worth of the
stream at an H200's rate (`H200_BLOCK_EVENTS_PER_S` over the store's `linger_s`), as a collector
that keeps up holds at most that much unwritten; without it the whole map is queued before the
writer catches up (a backlog of the entire run: what the allocator keeps after such a transient
is counted too).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
from _ingest_stream import (
    BLOCK_SIZE,
    EPOCH,
    H200_BLOCK_EVENTS_PER_S,
    STEP_S,
    TOKEN_POOL,
    VOCAB,
    VllmBlockStored,
    VllmEventBatch,
)

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import Batch, BlocksStored, StreamId
from kvscope.collector.wire import table_key
from kvscope.storage.engine import open_store
from kvscope.storage.heap_trim import trim_heap
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

RSS_ROOT_P = 0.02
"""In the RSS map, the share of stores that start a new tree (parent None)."""
MASK64 = (1 << 64) - 1


# --- 4. memory per cached block ----------------------------------------------------------------
def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection, so distinct inputs give distinct hashes."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _token_pool(rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(VOCAB) for _ in range(BLOCK_SIZE)] for _ in range(TOKEN_POOL)]


def _stores(
    blocks: int, seed: int, rng: random.Random, pool: list[list[int]]
) -> Iterator[tuple[list[int], int | None, list[int]]]:
    """(hashes, parent, tokens) of each store that makes a map of `blocks` cached blocks.

    Hashes come from a counter through a bijective mix, so choosing an existing parent keeps no
    list of hashes alive beside the map.
    """
    salt = (seed & 0xFFFF) << 40
    count = 0
    while count < blocks:
        n = min(rng.randint(1, 32), blocks - count)
        parent = None
        if count and rng.random() >= RSS_ROOT_P:
            parent = _mix64(salt + rng.randrange(count))
        hashes = [_mix64(salt + count + i) for i in range(n)]
        tokens: list[int] = []
        for block_hash in hashes:
            tokens += pool[block_hash % TOKEN_POOL]
        yield hashes, parent, tokens
        count += n


def rss_child(blocks: int, seed: int) -> None:
    """In a fresh interpreter: build a map of `blocks` cached blocks, print RSS as JSON."""
    rng = random.Random(seed)
    pool = _token_pool(rng)  # held to the end, as the map's tokens are
    stores = _stores(blocks, seed, rng, pool)
    pmap = PrefixMap(StreamId("bench", 0))
    key = table_key("GPU", 0)
    gc.collect()
    before = _rss_bytes()
    for seq, (hashes, parent, tokens) in enumerate(stores):
        event = BlocksStored(hashes, parent, tokens, BLOCK_SIZE, key)
        pmap.apply(Batch(seq, EPOCH + seq * STEP_S, 0, [event]))
    del hashes, tokens, event
    gc.collect()
    after = _rss_bytes()
    totals = pmap.totals()
    print(json.dumps({"blocks": totals.blocks, "before": before, "after": after}))


PER_TAKE = H200_BLOCK_EVENTS_PER_S * StoreSettings().linger_s
"""Block-events a collector that keeps up at an H200's rate holds unwritten at most: a take's."""


def feed_store(
    ingest: StreamIngest,
    writer: StoreWriter,
    stores: Iterator[tuple[list[int], int | None, list[int]]],
    keep_up: bool,
) -> list[int]:
    """Each store as vLLM's payload into `ingest`; with `keep_up`, the writer waited for after
    each `PER_TAKE` block-events. The block-events fed at each wait."""
    encode = msgspec.msgpack.Encoder().encode
    waits: list[int] = []
    fed = unwritten = 0
    for seq, (hashes, parent, tokens) in enumerate(stores):
        event = VllmBlockStored(hashes, parent, tokens, BLOCK_SIZE, None, "GPU", None)
        payload = encode(VllmEventBatch(EPOCH + seq * STEP_S, [event]))
        ingest.live_frames([b"", seq.to_bytes(8, "big"), payload], EPOCH + seq * STEP_S)
        fed += len(hashes)
        unwritten += len(hashes)
        if keep_up and unwritten >= PER_TAKE:
            if not writer.flush(600):
                raise RuntimeError("the writer did not catch up within 600 s")
            waits.append(fed)
            unwritten = 0
    return waits


def store_rss_child(blocks: int, seed: int, keep_up: bool) -> None:
    """The same, with the store on (a SQLite file): RSS once the writer has written it all;
    with `keep_up`, the writer waited for after each take's worth of the stream."""
    rng = random.Random(seed)
    pool = _token_pool(rng)
    stores = _stores(blocks, seed, rng, pool)
    with tempfile.TemporaryDirectory() as tmp:
        writer = StoreWriter(
            open_store(f"sqlite:///{Path(tmp) / 'rss.sqlite'}"),
            StoreSettings(queue_rows=10_000_000),
        )
        ingest = StreamIngest(StreamId("bench", 0), can_replay=False, sink=writer)
        gc.collect()
        trim_heap()
        before = _rss_bytes()
        feed_store(ingest, writer, stores, keep_up)
        if not writer.flush(600) or writer.stats.batches_dropped:
            raise RuntimeError(f"the writer did not write everything: {writer.stats}")
        gc.collect()
        trim_heap()
        after = _rss_bytes()
        blocks_held = ingest.map.totals().blocks
        writer.close(600)
    print(json.dumps({"blocks": blocks_held, "before": before, "after": after}))


def measure_rss(blocks: int, seed: int, store: bool = False, keep_up: bool = False) -> float:
    """RSS per cached block of a map of `blocks` built in a fresh interpreter; with `store`,
    with the store on (with `keep_up`, the writer kept up with the stream)."""
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            str(blocks),
            "--seed",
            str(seed),
            *(["--store"] if store else []),
            *(["--keep-up"] if keep_up else []),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["blocks"] != blocks:
        raise RuntimeError(f"the RSS map holds {result['blocks']} blocks, not {blocks}")
    return float(result["after"] - result["before"]) / blocks


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", action="store_true", help="with the store on (SQLite)")
    parser.add_argument(
        "--keep-up", action="store_true", help="with --store: wait for the writer after each take"
    )
    args = parser.parse_args()
    if args.store:
        store_rss_child(args.blocks, args.seed, args.keep_up)
    else:
        rss_child(args.blocks, args.seed)
