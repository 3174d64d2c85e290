"""Which reset request a stored clear followed: the one rule the API and the demo share.

A reset asked for through kvscope is a `reset_requests` row, stamped with the API's clock; the
clear it made is a `resets` row, received on the collector's clock (`recv_ts`; the engine's
`ts` may be simulated, as in the lab, or skewed). A clear follows the latest successful request
for its replica at most `window` seconds before it arrived; a refused request made no clear.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, Select, select

from kvscope.storage import schema

Requests = Mapping[str, Sequence[Row[Any]]]
"""reset_requests rows by replica."""


def resets_query() -> Select[Any]:
    """Stored resets (without their `before` map) with their stream's replica and rank."""
    r, s = schema.resets, schema.streams
    columns = [c for c in r.c if c.name != "before"]
    return select(*columns, s.c.replica, s.c.rank).join(s, s.c.id == r.c.stream_id)


def load_requests(conn: Connection, replica: str | None = None) -> Requests:
    """The reset requests (of one replica, or all), by replica, oldest first."""
    t = schema.reset_requests
    query = select(t).order_by(t.c.requested_at, t.c.id)
    if replica is not None:
        query = query.where(t.c.replica == replica)
    by: dict[str, list[Row[Any]]] = {}
    for row in conn.execute(query):
        by.setdefault(row.replica, []).append(row)
    return by


def linked_request(reset: Row[Any], requests: Requests, window: float) -> Row[Any] | None:
    """The successful request through kvscope that this clear (a `resets_query` row) followed."""
    arrived = reset.recv_ts if reset.recv_ts is not None else reset.ts
    candidates = [
        req
        for req in requests.get(reset.replica, ())
        if req.outcome == "success" and req.requested_at <= arrived <= req.requested_at + window
    ]
    return max(candidates, key=lambda req: req.requested_at, default=None)


def linked_mode(stored: str | None, request: Row[Any] | None) -> str | None:
    """A reset's mode: as stored with it, else the mode of the request it followed."""
    mode = stored or (request.mode if request is not None else None)
    return None if mode is None else str(mode)


def clears_by_request(conn: Connection, window: float, after_id: int = 0) -> dict[int, list[int]]:
    """request id -> the ids of the stored resets (newer than `after_id`) linked to it."""
    requests = load_requests(conn)
    by: dict[int, list[int]] = {}
    for reset in conn.execute(resets_query().where(schema.resets.c.id > after_id)):
        request = linked_request(reset, requests, window)
        if request is not None:
            by.setdefault(int(request.id), []).append(int(reset.id))
    return {i: sorted(ids) for i, ids in by.items()}
