"""The API links each reset to the request that caused it, by the collector's clock, and says
so when the lagging writer may not have stored an instant yet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

pytestmark = pytest.mark.vllm
STREAM = StreamId("r1", 0)
TOKEN = "s3cret"


def _link_store(
    path: Path,
    clears: list[tuple[int, float, float]],
    requests: list[tuple[float, str, str]],
    restarts: frozenset[int] = frozenset(),
) -> Engine:
    """A store of replica "lab": clears (seq, engine ts, recv_ts), requests (at, mode, outcome);
    the clears whose seq is in `restarts` are engine restarts."""
    from sqlalchemy import insert

    from kvscope.storage import schema

    engine = open_store(f"sqlite:///{path / 's.sqlite'}")
    with engine.begin() as conn:
        sid = conn.execute(
            insert(schema.streams).values(replica="lab", rank=0).returning(schema.streams.c.id)
        ).scalar_one()
        common = {
            "stream_id": sid,
            "epoch": 0,
            "degraded": False,
            "before_blocks": 5,
            "before_hittable": 5,
            "before_orphans": 0,
            "before_tokens": 80,
            "before": b"",
        }
        for seq, ts, recv_ts in clears:
            reason = "restart" if seq in restarts else "all_blocks_cleared"
            conn.execute(
                insert(schema.resets).values(
                    seq=seq, ts=ts, recv_ts=recv_ts, reason=reason, **common
                )
            )
        for at, mode, outcome in requests:
            conn.execute(
                insert(schema.reset_requests).values(
                    replica="lab",
                    requested_at=at,
                    requested_by="t",
                    mode=mode,
                    external=False,
                    outcome=outcome,
                    http_status=200,
                    detail="",
                )
            )
    return engine


def test_a_reset_request_links_by_the_collectors_clock_not_the_engines(tmp_path: Path) -> None:
    """A lab's batches carry simulated time: the clear is matched by when it arrived."""
    from fastapi.testclient import TestClient

    now = time.time()
    engine = _link_store(tmp_path, [(7, now + 5000, now + 1)], [(now, "keep", "success")])
    client = TestClient(create_app(ApiData(engine=engine)))
    (reset,) = client.get("/resets").json()
    assert reset["mode"] == "keep" and reset["request"]["mode"] == "keep"


def test_the_demos_links_are_the_apis(tmp_path: Path) -> None:
    """`clears_by_request` (the demo's table) and GET /resets link by the same rule."""
    from fastapi.testclient import TestClient

    from kvscope.storage.reset_links import clears_by_request

    now = time.time()
    engine = _link_store(
        tmp_path,
        [(3, 3, now + 1), (9, 9, now + 12), (20, 20, now + 500)],
        [
            (now, "default", "refused"),
            (now + 0.5, "preempt", "success"),
            (now + 10, "keep", "success"),
        ],
    )
    with engine.connect() as conn:
        links = clears_by_request(conn, ApiSettings().link_window_s)
    client = TestClient(create_app(ApiData(engine=engine)))
    api: dict[int, list[int]] = {}
    for reset in client.get("/resets").json():
        if reset["request"] is not None:
            api.setdefault(reset["request"]["id"], []).append(reset["id"])
    # The refused request made no clear; the last clear came long after any request.
    assert links == api == {2: [1], 3: [2]}


def test_a_restart_soon_after_a_request_is_not_its_reset(tmp_path: Path) -> None:
    """Only an AllBlocksCleared is what a reset request made; a restart empties the cache too,
    but of its own accord."""
    from fastapi.testclient import TestClient

    from kvscope.storage.reset_links import clears_by_request

    now = time.time()
    engine = _link_store(
        tmp_path,
        [(4, 4, now + 1), (1, 5, now + 2)],
        [(now, "keep", "success"), (now + 1.5, "preempt", "success")],
        restarts=frozenset({1}),
    )
    with engine.connect() as conn:
        links = clears_by_request(conn, ApiSettings().link_window_s)
    assert links == {1: [1]}  # the restart (reset 2) follows request 2 closely, yet is no link
    client = TestClient(create_app(ApiData(engine=engine)))
    by_reason = {reset["reason"]: reset for reset in client.get("/resets").json()}
    assert by_reason["restart"]["request"] is None and by_reason["restart"]["mode"] is None
    assert by_reason["all_blocks_cleared"]["request"]["id"] == 1


def last_ts(ingest: StreamIngest) -> float:
    """The ts of the last batch `ingest` applied."""
    ts = ingest.map.counters.last_ts
    assert ts is not None, "no batch applied yet"
    return ts


class StoreRefusesWrites:
    """The writer's engine while the store takes no writes (reads still work)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def begin(self) -> object:
        raise OperationalError("BEGIN", {}, ConnectionError("store unreachable"))

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)


def test_an_instant_the_lagging_writer_may_not_have_stored_is_said_to_be_unknown(
    tmp_path: Path,
) -> None:
    records = list(read_capture(capture_path("lab_3rps_180s.msgpack.gz")))
    engine = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    writer = StoreWriter(engine, StoreSettings(retry_initial_s=0.05, retry_max_s=0.05))
    lab = StreamId("lab", 0)
    ingest = StreamIngest(lab, can_replay=False, sink=writer)
    half = len(records) // 2
    for record in records[:half]:
        ingest.live_frames(record.frames, record.recv_ts)
    assert writer.flush()
    early_ts, early = last_ts(ingest), ingest.map.counts()
    writer.engine = StoreRefusesWrites(engine)  # type: ignore[assignment]
    for record in records[half:]:
        ingest.live_frames(record.frames, record.recv_ts)
    data = ApiData(engine=engine, writer=writer)
    try:
        lagging = data.map_at(lab, last_ts(ingest))
        assert any("writer is behind" in reason for reason in lagging.unknown_because)
        # what the store holds, and it says so
        assert lagging.seq is not None and ingest.last_seq is not None
        assert lagging.seq < ingest.last_seq
        # Batches stamped after an instant are stored: that instant is whole.
        past = data.map_at(lab, early_ts - 5)
        assert not past.unknown_because
    finally:
        writer.engine = engine
    caught_up = data.map_at(lab, last_ts(ingest))
    assert caught_up.unknown_because == [] and caught_up.map.counts() == ingest.map.counts()
    assert data.map_at(lab, early_ts).map.counts() == early
    writer.close()
