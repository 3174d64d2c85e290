"""A store's writer told of a fleet's batches applied straight from their bytes (collector/
_replay.pyx's `FusedApply`, with no `Batch` decoded) stores what it stores when each batch is
decoded and applied: the same log, epochs, checkpoints, rollups, resets and intervals, and the
same maps read back at every checkpoint and around each clear (a real SQLite file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import select

from kvscope.collector.limits import IngestLimits
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_fleet_live_fused import CAPTURED, TOPICS, run


def steps() -> list[tuple[bytes, bytes, str, int, int]]:
    """vLLM 0.33's batches from two publishers (the second with a replay socket, never
    answered), with a clear, a gap, a repeat, a restart and a damaged batch among them."""
    out = [(topic, payload, "next", 8, 3) for payload in CAPTURED for topic in TOPICS[:2]]
    ts = msgspec.msgpack.decode(CAPTURED[40])[0]
    clear = msgspec.msgpack.encode([ts, [{"type": "AllBlocksCleared"}]])
    out.insert(81, (TOPICS[0], clear, "next", 8, 3))
    out.insert(82, (TOPICS[1], clear, "next", 8, 3))
    out[100] = (*out[100][:2], "skip", 8, 3)
    out[130] = (*out[130][:2], "again", 8, 3)
    out[150] = (out[150][0], out[150][1][:-3], "next", 8, 3)
    out[200] = (*out[200][:2], "restart", 8, 3)
    return out


def rows(conn: Any, table: Any, *skip: str) -> list[tuple[object, ...]]:
    columns = [c for c in table.c if c.name not in skip]
    return sorted(tuple(r) for r in conn.execute(select(*columns)))


def stored(url: str, fused: bool) -> tuple[int, dict[str, object]]:
    """Batches applied from their bytes, and what the store holds of the fleet."""
    writer = StoreWriter(open_store(url), StoreSettings(checkpoint_every_batches=20))
    _, streams, _, taken = run(steps(), IngestLimits(), fused, lambda: writer)
    writer.close()
    held: dict[str, object] = {}
    with open_store(url).connect() as conn:
        for name, table in [
            ("epochs", schema.epochs),
            ("checkpoints", schema.checkpoints),
            ("resets", schema.resets),
            ("intervals", schema.intervals),
            ("rollups", schema.rollups),
        ]:
            held[name] = rows(conn, table, "id", "snapshot")
        for stream in streams:
            sid = stream_id(conn, stream.replica, stream.rank)
            log = [(b.epoch, *b.batch) for b in batch_log.all_batches(conn, sid)]
            held[f"log {stream}"] = log
            maps = {}
            for epoch, seq, *_ in log[::7]:
                again = rebuild(conn, position_at_seq(conn, sid, seq, epoch), stream)
                maps[(epoch, seq)] = (again.map.counts(), again.unknown_because)
            held[f"maps {stream}"] = maps
    return taken, held


def test_a_store_told_of_batches_applied_from_their_bytes_holds_what_decoding_stores(
    tmp_path: Path,
) -> None:
    taken, held = stored(f"sqlite:///{tmp_path / 'fused.sqlite'}", True)
    taken_today, held_today = stored(f"sqlite:///{tmp_path / 'today.sqlite'}", False)
    assert taken_today == 0
    assert taken > 200  # nearly every batch of both streams
    assert held.keys() == held_today.keys()
    for name, value in held_today.items():
        assert held[name] == value, name
    assert len(held["checkpoints"]) >= 8  # type: ignore[arg-type]
    assert len(held["resets"]) >= 3  # type: ignore[arg-type]
