"""A transaction's recovery rows made one per reset before they are written."""

from __future__ import annotations

from dataclasses import replace

from kvscope.collector.types import StreamId
from kvscope.storage.recovery import RecoveryPoint
from kvscope.storage.rows import RecoveryRow, Row


def one_recovery_each(ordered: list[Row]) -> list[Row]:
    """`ordered` with each reset's recovery rows made one, at the last one's place: its figures
    the last's, its points all of theirs (the later's where two give an offset), as writing
    each in turn leaves the store. A row holds all its reset's points so far, so a transaction
    that several of them reached wrote each point as many times over, each UPDATE and point a
    statement step (and a GIL hand-back) of its own."""
    recoveries = [row for row in ordered if type(row) is RecoveryRow]
    if len(recoveries) == len({(row.stream, row.key) for row in recoveries}):
        return ordered
    points: dict[tuple[StreamId, tuple[int, int, str]], dict[float, RecoveryPoint]] = {}
    last: dict[tuple[StreamId, tuple[int, int, str]], RecoveryRow] = {}
    for recovery in recoveries:
        key = (recovery.stream, recovery.key)
        points.setdefault(key, {}).update((p.offset_s, p) for p in recovery.points)
        last[key] = recovery
    merged: list[Row] = []
    for row in ordered:
        if type(row) is RecoveryRow:
            if last[row.stream, row.key] is not row:
                continue
            row = replace(row, points=tuple(points[row.stream, row.key].values()))
        merged.append(row)
    return merged
