"""A clear hands the sink the emptied tables themselves (storage/rows.py `BeforeMap`): whatever
the stream does after (stores and removals in the clear's own batch and later ones, the live
path's compiled apply, more clears, a restart), those tables must hold what they held at the
clear, and a `before` map must encode to the snapshot a copy made then, spilled or not."""

from __future__ import annotations

import pickle
import random
from array import array

from kvscope.collector.ingest import MESSAGES_BETWEEN_RESTARTS, StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearedMap, NullSink
from kvscope.collector.snapshot import copy_tables, encode_copy
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    StreamId,
    TableKey,
)
from kvscope.storage.rows import BeforeMap, encode_before
from tests.test_ingest import CLEAR, frames, payload, remove, store

STREAM = StreamId("r", 0)


class _AtClear(NullSink):
    """Each clear, and a copy of its tables made as it came."""

    def __init__(self) -> None:
        self.seen: list[tuple[ClearedMap, bytes]] = []

    def map_cleared(self, cleared: ClearedMap) -> None:
        self.seen.append((cleared, copy_tables(cleared.tables, cleared.signed_hashes)))


def test_cleared_tables_stay_as_the_clear_left_them() -> None:
    rng = random.Random(3)
    sink = _AtClear()
    ingest = StreamIngest(STREAM, can_replay=False, sink=sink)
    seq = 0
    held: list[int] = []
    for message in range(3 * MESSAGES_BETWEEN_RESTARTS + 40):
        if message in (MESSAGES_BETWEEN_RESTARTS + 5, 2 * MESSAGES_BETWEEN_RESTARTS + 30):
            seq, held = 0, []  # the publisher starts over: a restart
        events = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.08:
                events.append(CLEAR)
                held = []
            elif roll < 0.3 and held:
                events.append(remove(*rng.sample(held, min(len(held), 2))))
            else:
                new = [rng.randrange(1, 1 << 40) for _ in range(rng.randint(1, 3))]
                parent = rng.choice(held) if held and rng.random() < 0.7 else None
                events.append(store(*new, parent=parent))
                held += new
        ingest.live_frames(frames(seq, payload(*events, ts=1.0 + message)), 1.0 + message)
        seq += 1
    assert ingest.counters.restarts == 2 and len(sink.seen) > 10
    for cleared, copy in sink.seen:
        assert copy_tables(cleared.tables, cleared.signed_hashes) == copy
        before = BeforeMap(cleared.tables, cleared.signed_hashes)
        want = encode_copy(copy)
        assert encode_before(before) == want
        assert encode_before(pickle.loads(pickle.dumps(before))) == want


def _map_of(rng: random.Random) -> tuple[ClearedMap, bytes]:
    """A map of whatever a table holds (odd-sized blocks, LoRA names, extra keys, hashes sent
    as bytes, orphans, removals, signed hashes, tables emptied) cleared."""
    keys = [TableKey("GPU", 0), TableKey("CPU", 0), TableKey("GPU", 1)]
    handed: list[tuple[ClearedMap, bytes]] = []

    def on_clear(cleared: ClearedMap) -> None:
        handed.append((cleared, copy_tables(cleared.tables, cleared.signed_hashes)))

    prefix_map = PrefixMap(STREAM, on_clear)
    hashes: list[int] = []
    events: list[KVEvent] = []
    for _ in range(rng.randint(0, 30)):
        key = rng.choice(keys)
        if hashes and rng.random() < 0.3:
            events.append(BlocksRemoved(rng.sample(hashes, min(len(hashes), 3)), key))
            continue
        chain = [rng.getrandbits(63) for _ in range(rng.randint(1, 4))]
        size = rng.choice([4, 4, 8])
        width = rng.choice([3, 10, 17, 32])
        tokens = array("I", [rng.randrange(1 << width) for _ in range(len(chain) * size)])
        parent = rng.choice(hashes) if hashes and rng.random() < 0.6 else None
        raw = [h.to_bytes(8, "big") for h in chain] if rng.random() < 0.15 else None
        events.append(
            BlocksStored(
                chain,
                parent,
                tokens if rng.random() < 0.9 else array("I"),
                size,
                key,
                lora_name="l" if rng.random() < 0.15 else None,
                extra_keys=[1, "x"] if rng.random() < 0.15 else None,
                raw_hashes=raw,
                raw_parent=None if raw is None or parent is None else parent.to_bytes(8, "big"),
                signed_hashes=rng.random() < 0.1,
            )
        )
        hashes += chain
    prefix_map.apply(Batch(0, 1.0, 0, events))
    prefix_map.apply(Batch(1, 2.0, 0, [AllCleared(), *events[:3]]))
    assert len(handed) == 1
    return handed[0]


def test_any_before_map_encodes_as_its_copy() -> None:
    rng = random.Random(4)
    for _ in range(150):
        cleared, copy = _map_of(rng)
        before = BeforeMap(cleared.tables, cleared.signed_hashes)
        want = encode_copy(copy)
        assert encode_before(before) == want
        back = pickle.loads(pickle.dumps(before))
        assert back.signed == cleared.signed_hashes and encode_before(back) == want
