"""benchmarks/store.py's disk figures: where the bytes of a store go, on a stream or a recording.

A store's file is split by table (the log's chunks, checkpoints, the rest: rollups, resets,
indexes and free pages), and the same log rows are packed in each chunk format this kvscope
writes, so that today's layout and the new one are measured on the same batches.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import msgspec
from _content_floor import ContentFloor, content_floor
from _ingest_stream import H200_BLOCK_EVENTS_PER_S
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import OperationalError

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch
from kvscope.collector.snapshot import SNAPSHOT_FORMATS, recode
from kvscope.collector.types import StreamId
from kvscope.storage.checkpoint_blocks import stored_blocks
from kvscope.storage.engine import open_store
from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import WRITABLE_FORMATS
from kvscope.storage.log_columns import FORMAT_6_MAGIC, FRAMES, KNOWN_FRAMES, _get_varint
from kvscope.storage.log_packer import LogPacker
from kvscope.storage.rows import LogRow
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

FLEET_REPLICAS, FLEET_DAYS = 100, 7
REPO = Path(__file__).resolve().parents[1]
RECORDINGS = (
    REPO / "kvscope" / "data" / "lab_3rps_180s.msgpack.gz",
    REPO / "tests" / "data" / "lab_10rps_300s.msgpack.gz",
)


@dataclass(frozen=True)
class Disk:
    """A store's bytes, per block-event."""

    block_events: int
    file_bytes: int
    log_bytes: int
    """The log's chunks and the dictionaries they are compressed against."""
    dictionary_bytes: int
    checkpoint_bytes: int
    log_by_format: dict[int, int]
    """The same log rows packed in each chunk format (the bytes of their `data`, and of the
    dictionaries they name)."""
    snapshots_by_format: dict[int, int]
    """The stored key checkpoints (not deltas) and resets' "before" maps, re-written in each
    snapshot format."""
    empty_bytes: int
    """A new store's file before anything is written: a page per table and index, a fixed cost
    that a short recording's bytes per block-event carry in full."""
    floor: ContentFloor
    pages: dict[str, int]
    """The file's pages by what holds them (SQLite's dbstat, where it is built in): the log's,
    checkpoints', resets' tables, the other tables, the indexes, free pages, and the slack left
    unused in all of those pages."""
    log_frames: dict[str, int]
    """The log's columnar chunks' bytes by frame."""
    free_bytes: int = 0
    """The file's free pages: those a compaction (the writer's idle re-packing,
    storage/log_repack.py) freed and the idle writer kept (storage/free_pages.py gives back
    only those past `FreePages.KEPT`), which the rows that follow take before the file grows."""

    def per_event(self, size: float) -> float:
        return size / self.block_events

    def lines(self, what: str) -> list[str]:
        other = self.file_bytes - self.log_bytes - self.checkpoint_bytes
        formats = ", ".join(
            f"format {fmt}: {self.per_event(size):.1f}"
            for fmt, size in sorted(self.log_by_format.items())
        )
        snapshots = ", ".join(
            f"format {fmt}: {self.per_event(size):.1f}"
            for fmt, size in sorted(self.snapshots_by_format.items())
        )
        return [
            f"disk, {what}: {self.file_bytes:,} bytes for {self.block_events:,} block-events: "
            f"{self.per_event(self.file_bytes):.1f} bytes per block-event, "
            f"{self.per_event(self.file_bytes - self.free_bytes):.1f} in use (less "
            f"{self.per_event(self.free_bytes):.1f} of free pages, which the rows that follow "
            "take first)  (target <= 20)",
            f"  log {self.per_event(self.log_bytes):.1f} (of which dictionaries "
            f"{self.per_event(self.dictionary_bytes):.1f}), checkpoints "
            f"{self.per_event(self.checkpoint_bytes):.1f}, the rest {self.per_event(other):.1f} "
            f"(of which a new store's empty pages {self.per_event(self.empty_bytes):.1f}); "
            f"the log's batches packed as chunk {formats}; the checkpoints and resets' before "
            f"maps as snapshot {snapshots}",
            "  by B-tree: "
            + ", ".join(f"{k} {self.per_event(v):.1f}" for k, v in self.pages.items()),
            "  the log's columnar chunks by frame: "
            + ", ".join(f"{k} {self.per_event(v):.1f}" for k, v in self.log_frames.items()),
            self.floor.line(),
        ]


def projection(bytes_per_event: float) -> str:
    day = bytes_per_event * H200_BLOCK_EVENTS_PER_S * 86_400
    fleet = day * FLEET_REPLICAS * FLEET_DAYS
    return (
        f"{_size(day)} per replica-day at {H200_BLOCK_EVENTS_PER_S:,} block-events/s, "
        f"{_size(fleet)} for {FLEET_REPLICAS} replicas x {FLEET_DAYS} days"
    )


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def measure(folder: Path, block_events: int, log: Sequence[LogRow]) -> Disk:
    """The SQLite store in `folder` (its only files), after its writer closed (its idle work
    done)."""
    url = f"sqlite:///{next(folder.glob('*.sqlite'))}"
    engine = create_engine(url)
    with engine.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        log_bytes = conn.execute(text("SELECT sum(length(data)) FROM log_chunks")).scalar()
        dictionaries = conn.execute(text("SELECT sum(length(data)) FROM log_dictionaries")).scalar()
        snapshots = conn.execute(text("SELECT sum(length(snapshot)) FROM checkpoints")).scalar()
        stored = [
            (bytes(data), sid)
            for query in (
                "SELECT snapshot, stream_id FROM checkpoints WHERE key_seq IS NULL",  # no deltas
                "SELECT before, stream_id FROM resets",
            )
            for data, sid in conn.execute(text(query))
        ]
        # A checkpoint may name its stream's log dictionary's blocks (snapshot format 5).
        recoded = {
            fmt: sum(len(recode(data, fmt, stored_blocks(conn, sid))) for data, sid in stored)
            for fmt in SNAPSHOT_FORMATS
        }
        pages = _pages(conn)
        free = conn.execute(text("PRAGMA freelist_count")).scalar() or 0
        free *= conn.execute(text("PRAGMA page_size")).scalar() or 0
        frames = _log_frames(
            bytes(d) for d in conn.execute(text("SELECT data FROM log_chunks")).scalars()
        )
    engine.dispose()
    return Disk(
        block_events,
        sum(p.stat().st_size for p in folder.iterdir()),
        int(log_bytes or 0) + int(dictionaries or 0),
        int(dictionaries or 0),
        int(snapshots or 0),
        {fmt: packed_size(log, fmt) for fmt in WRITABLE_FORMATS},
        recoded,
        empty_store_bytes(),
        content_floor(row[5] for row in log),
        pages,
        frames,
        int(free),
    )


_OWN_TABLES = ("log_chunks", "log_dictionaries", "checkpoints", "resets")
FRAME_NAMES = (
    "stamps",
    "sizes",
    "skeleton",
    "hash refs",
    "hash literals",
    "floats",
    "tokens",
    "granules",
    "token planes",
)
KNOWN_FRAME_NAMES = ("checkpoint hashes found", "their positions")


def _pages(conn: Connection) -> dict[str, int]:
    """Bytes of the file's pages by what holds them; empty where SQLite lacks dbstat."""
    try:
        rows = conn.execute(
            text("SELECT name, sum(pgsize), sum(unused) FROM dbstat GROUP BY name")
        ).all()
    except OperationalError:
        return {}
    indexes = {
        name
        for (name,) in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'"))
    }
    out = dict.fromkeys((*_OWN_TABLES, "other tables", "indexes", "free pages", "of all: slack"), 0)
    page_size = conn.execute(text("PRAGMA page_size")).scalar() or 0
    out["free pages"] = page_size * (conn.execute(text("PRAGMA freelist_count")).scalar() or 0)
    for name, size, unused in rows:
        key = name if name in _OWN_TABLES else "indexes" if name in indexes else "other tables"
        out[key] += int(size)
        out["of all: slack"] += int(unused)
    return out


def _log_frames(chunks: Iterable[bytes]) -> dict[str, int]:
    """Compressed bytes by frame of the columnar chunks (formats 3 to 6), their headers apart
    (format 6's two frames of literals found among a checkpoint's hashes last)."""
    out = dict.fromkeys((*FRAME_NAMES, *KNOWN_FRAME_NAMES, "headers"), 0)
    for data in chunks:
        pos = 5 + data[4]
        if data[:4] == FORMAT_6_MAGIC:
            pos += 1 + data[pos]
            count, pos = _get_varint(data, pos)
            names = [*FRAME_NAMES[: count - KNOWN_FRAMES], *KNOWN_FRAME_NAMES]
        elif data[:4] in FRAMES:
            names = list(FRAME_NAMES[: FRAMES[data[:4]]])
        else:
            continue
        _, pos = _get_varint(data, pos)
        total = 0
        for name in names:
            n, pos = _get_varint(data, pos)
            out[name] += n
            total += n
        out["headers"] += len(data) - total
    return out


@cache
def empty_store_bytes() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "empty.sqlite"
        open_store(f"sqlite:///{path}").dispose()
        engine = create_engine(f"sqlite:///{path}")
        with engine.connect() as conn:
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        engine.dispose()
        return sum(p.stat().st_size for p in Path(tmp).iterdir())


def packed_size(log: Sequence[LogRow], fmt: int) -> int:
    """Bytes of `log` packed in chunks of format `fmt`, cut as a writer taking 5,000 rows per
    transaction cuts them; in formats 2 and 3 with the dictionaries it makes on the way."""
    if fmt == 1:
        return sum(
            len(chunk.data)
            for start in range(0, len(log), 5_000)
            for chunk in pack(log[start : start + 5_000], fmt)
        )
    packer, size = LogPacker(fmt=fmt), 0
    for start in range(0, len(log), 5_000):
        chunks, dictionaries = packer.pack(log[start : start + 5_000])
        packer.committed(dictionaries)
        size += sum(len(c.data) for c in chunks) + sum(len(d.data) for d in dictionaries)
    return size


class _Tap(StoreWriter):
    """A writer that also keeps the log rows it is given, for `packed_size`."""

    log: list[LogRow]

    def applied(self, batch: AppliedBatch) -> None:
        self.log.append(
            (batch.stream, batch.epoch, batch.seq, batch.ts, batch.recv_ts, batch.payload)
        )
        super().applied(batch)


def recording(path: Path, settings: StoreSettings) -> Disk:
    """A recorded stream ingested into a fresh SQLite store, as the collector would."""
    stream = StreamId(path.name.split(".")[0], 0)
    with tempfile.TemporaryDirectory() as tmp:
        writer = _Tap(open_store(f"sqlite:///{tmp}/rec.sqlite"), settings)
        writer.log = []
        ingest = StreamIngest(stream, can_replay=False, sink=writer)
        for record in read_capture(path):
            ingest.live_frames(record.frames, record.recv_ts)
        assert writer.flush(600, idle_work=True), "the writer stopped"  # as compact as it gets
        writer.close(600)
        counters = ingest.map.counters
        return measure(Path(tmp), counters.stored_blocks + counters.removed_blocks, writer.log)


def stream_log(stream: StreamId, payloads: Sequence[bytes]) -> list[LogRow]:
    """A benchmark stream's payloads as the writer's log rows (epoch 0, seq = position); the
    receive times a collector a few ms behind the engine would stamp."""
    rng = random.Random(0)
    rows: list[LogRow] = []
    for seq, payload in enumerate(payloads):
        ts = float(msgspec.msgpack.decode(payload)[0])
        rows.append((stream, 0, seq, ts, ts + 3.0 + rng.uniform(0.0, 0.004), payload))
    return rows


def recordings(
    settings: StoreSettings, paths: Iterable[Path] = RECORDINGS
) -> list[tuple[str, Disk]]:
    return [(path.name.split(".")[0], recording(path, settings)) for path in paths]
