"""Which reset request a stored clear followed: the one rule the API, the demo, the report and
the dashboards share.

A reset asked for through kvscope is a `reset_requests` row, stamped with the API's clock; the
clear it made is a `resets` row, received on the collector's clock (`recv_ts`; the engine's
`ts` may be simulated, as in the lab, or skewed). An `all_blocks_cleared` follows the latest
successful request for its replica at most `window` seconds before it arrived (the later one
recorded, of two at the same instant); a refused request made no clear, and a restart is no
request's doing. `linked_request` says it in Python, `linked_request_sql` in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, Select, select

from kvscope.collector.sink import ClearReason
from kvscope.storage import schema

LINK_WINDOW_S = 120.0
"""The default `window`: how long before a clear arrives a successful reset request may be and
still be its cause. The API (`ApiSettings.link_window_s`), dashboards and reports use it."""
LINKED_REASON = ClearReason.ALL_BLOCKS_CLEARED.value
"""The only clears a reset request makes."""
LINKED_OUTCOME = "success"
"""The only requests that made one: vLLM refuses a reset while running requests hold blocks."""

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
    if reset.reason != LINKED_REASON:
        return None
    arrived = reset.recv_ts if reset.recv_ts is not None else reset.ts
    candidates = [
        req
        for req in requests.get(reset.replica, ())
        if req.outcome == LINKED_OUTCOME
        and req.requested_at <= arrived <= req.requested_at + window
    ]
    return max(candidates, key=lambda req: (req.requested_at, req.id), default=None)


def linked_request_sql(window: float, reset: str = "r", stream: str = "s", as_: str = "q") -> str:
    """`linked_request` as a LEFT JOIN of `reset_requests AS {as_}` (NULLs when none), after
    `FROM resets {reset} JOIN streams {stream}`: plain SQL that PostgreSQL and SQLite both run,
    for the dashboards. `tests/test_dashboards_names.py` checks it pairs as `linked_request`
    does."""
    arrived = f"COALESCE({reset}.recv_ts, {reset}.ts)"
    return f"""
    LEFT JOIN reset_requests {as_} ON {as_}.id = (
      SELECT x.id FROM reset_requests x
      WHERE {reset}.reason = '{LINKED_REASON}'
        AND x.replica = {stream}.replica AND x.outcome = '{LINKED_OUTCOME}'
        AND x.requested_at <= {arrived}
        AND {arrived} <= x.requested_at + {float(window)!r}
      ORDER BY x.requested_at DESC, x.id DESC
      LIMIT 1
    )"""


def linked_mode(stored: str | None, request: Row[Any] | None) -> str | None:
    """A reset's mode: as stored with it, else the mode of the request it followed."""
    mode = stored or (request.mode if request is not None else None)
    return None if mode is None else str(mode)


def linked_modes(
    conn: Connection, resets: Iterable[Row[Any]], window: float
) -> dict[int, str | None]:
    """reset id -> its mode (`linked_mode`), for `resets_query` rows."""
    requests = load_requests(conn)
    return {int(r.id): linked_mode(r.mode, linked_request(r, requests, window)) for r in resets}


def clears_by_request(conn: Connection, window: float, after_id: int = 0) -> dict[int, list[int]]:
    """request id -> the ids of the stored resets (newer than `after_id`) linked to it."""
    requests = load_requests(conn)
    by: dict[int, list[int]] = {}
    for reset in conn.execute(resets_query().where(schema.resets.c.id > after_id)):
        request = linked_request(reset, requests, window)
        if request is not None:
            by.setdefault(int(request.id), []).append(int(reset.id))
    return {i: sorted(ids) for i, ids in by.items()}
