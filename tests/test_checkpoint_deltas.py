"""The writer's choice between a key and a delta: a delta while it is at most the mean size of
the checkpoints since its key, which a delta that only grows makes a new key after a while."""

from __future__ import annotations

import random

import msgspec
from msgspec.structs import replace

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import copy_map, encode_copy
from kvscope.collector.types import Batch, StreamId
from kvscope.storage import checkpoint_blocks
from kvscope.storage.checkpoint_blocks import known_of
from kvscope.storage.checkpoint_deltas import CheckpointEncoder
from kvscope.storage.log_dictionary import GRANULE, Dictionary
from kvscope.storage.rows import CheckpointRow
from tests.test_prefix_map import stored

STREAM = StreamId("a", 0)


def _checkpoints(encoder: CheckpointEncoder, count: int) -> list[CheckpointRow]:
    """A map of a few thousand blocks, a few hundred replaced between checkpoints."""
    rng = random.Random(11)
    prefix_map = PrefixMap(STREAM)
    rows = []
    for seq in range(count):
        prefix_map.apply(Batch(seq, float(seq), 0, [stored([rng.getrandbits(62) + 1], None)]))
        chains = [[rng.getrandbits(62) + 1 for _ in range(8)] for _ in range(40)]
        prefix_map.apply(Batch(seq, float(seq), 0, [stored(chain, None) for chain in chains]))
        row = CheckpointRow(STREAM, 0, seq, float(seq), 0, copy_map(prefix_map))
        encoder.encode(row)
        rows.append(row)
    return rows


def test_a_delta_is_at_most_the_mean_checkpoint_since_its_key() -> None:
    rows = _checkpoints(CheckpointEncoder(1.0), 30)
    keys = [row for row in rows if row.key_seq is None]
    assert rows[0].key_seq is None and 2 <= len(keys) < len(rows) - 10
    since_key: list[int] = []
    for row in rows:
        if row.key_seq is None:
            since_key = [len(row.packed)]
            key_seq = row.seq
        else:
            assert row.key_seq == key_seq
            assert len(row.packed) <= sum(since_key) / len(since_key)
            since_key.append(len(row.packed))


def test_share_0_writes_keys_only() -> None:
    assert all(row.key_seq is None for row in _checkpoints(CheckpointEncoder(0.0), 5))


def test_the_writer_keeps_no_known_blocks_past_a_checkpoint() -> None:
    """Its dictionary holds the same content: a copy kept beside it would only cost memory."""
    rng = random.Random(4)
    tokens = [rng.randrange(200_000) for _ in range(GRANULE * 8)]
    prefix_map = PrefixMap(STREAM)
    event = replace(stored(list(range(1, 9)), None), token_ids=tokens, block_size=GRANULE)
    prefix_map.apply(Batch(0, 0.0, 0, [event]))
    dictionary = Dictionary(b"".join(msgspec.msgpack.encode(t) for t in tokens))
    row = CheckpointRow(STREAM, 0, 0, 0.0, 8, copy_map(prefix_map))
    CheckpointEncoder(0.0).encode(row, dictionary)
    assert checkpoint_blocks._kept.get(dictionary.digest) is None
    assert row.packed == encode_copy(row.snapshot, known=known_of(dictionary))
