"""Feeding a recorded stream through the live ingest path, optionally dumping the map on the way."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from kvscope.collector.capture import CaptureRecord
from kvscope.collector.dump import write_dump
from kvscope.collector.ingest import StreamIngest


def play_into(
    ingest: StreamIngest,
    records: Iterable[CaptureRecord],
    *,
    dump_at: Iterable[int] = (),
    dump_dir: Path | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Apply `records` in order as if they came live; write `DIR/SEQ.jsonl` after each dump seq.

    A dump for seq N is written once every record with seq <= N has been applied, i.e. just
    before the first record beyond N (or at the end).
    """
    pending = sorted(set(dump_at))
    written: list[Path] = []

    def dump_through(limit: int | None) -> None:
        while pending and (limit is None or pending[0] < limit):
            seq = pending.pop(0)
            assert dump_dir is not None
            path = dump_dir / f"{seq}.jsonl"
            write_dump(ingest.map, path)
            written.append(path)

    if pending and dump_dir is None:
        raise ValueError("dump_at needs a dump_dir")
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
    for n, record in enumerate(records, 1):
        if pending:
            dump_through(record.seq)
        # A capture is what a SUB socket received: no replay socket stands behind it.
        ingest.live_frames(record.frames, record.recv_ts)
        if progress is not None:
            progress(n)
    dump_through(None)
    return written
