"""A reset's recovery is stored as it happens: each point as soon as the stream passes its
offset, said to be partial until the window is complete, and the same at any playback speed,
through `kvscope replay --store`'s path as through real sockets into the serve pipeline."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from kvscope.api.app import create_app
from kvscope.api.data import ApiData
from kvscope.capture_source import CaptureSource
from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.types import StreamId
from kvscope.config import Config, ReplicaConfig, StoreConfig
from kvscope.pipeline import running_pipeline
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter
from kvscope.store_commands import open_writer
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)
CAPTURE = "lab_3rps_180s.msgpack.gz"
"""Clears at seq 1055 (+90 s) and 1592 (+135 s); the recording ends at +180 s: both windows
end before their 300 s, the first at the second clear."""


def capture() -> list[CaptureRecord]:
    return list(read_capture(capture_path(CAPTURE)))


def stored_recovery(engine: Engine) -> list[tuple[Any, ...]]:
    """Per reset (by seq): its summary and every stored point, as the store holds them."""
    r, rr = schema.resets, schema.reset_recovery
    out = []
    with engine.connect() as conn:
        for row in conn.execute(select(r).order_by(r.c.seq)):
            points = conn.execute(
                select(rr).where(rr.c.reset_id == row.id).order_by(rr.c.offset_s)
            ).all()
            out.append(
                (
                    row.seq,
                    row.t50_s,
                    row.t90_s,
                    row.peak_orphans,
                    row.recovery_until_ts,
                    row.recovery_complete,
                    [
                        (
                            p.offset_s,
                            p.blocks,
                            p.hittable,
                            p.orphans,
                            p.share_blocks_back,
                            p.share_tokens_back,
                        )
                        for p in points
                    ],
                )
            )
    return out


def test_points_are_stored_as_the_stream_passes_them(tmp_path: Any) -> None:
    records = capture()
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    clear_ts = next(ingest_ts for ingest_ts in _clear_times(records))
    # Up to 12 s after the first clear (engine clock): +1, +2, +5 and +10 s are passed.
    head = [rec for rec in records if _ts(rec) <= clear_ts + 12.0]
    play_into(ingest, head)
    assert writer.flush()
    ((seq, t50, _t90, _peak, until, complete, points),) = stored_recovery(writer.engine)
    assert seq == 1055 and complete is False
    assert [p[0] for p in points] == [1.0, 2.0, 5.0, 10.0]
    # Followed as of the last write: the batch before the one past +10 s, or t50's.
    assert until is not None and clear_ts + 5.0 < until <= clear_ts + 12.0
    assert t50 is None or t50 <= 12.0

    play_into(ingest, records[len(head) :])
    assert writer.flush()
    open_rows = stored_recovery(writer.engine)
    writer.close()  # the stream stops: what was reached stays, still partial
    closed = stored_recovery(writer.engine)
    assert [r[0] for r in closed] == [1055, 1592]
    assert all(r[5] is False for r in closed)
    first, second = closed
    assert [p[0] for p in first[6]] == [1.0, 2.0, 5.0, 10.0, 20.0, 30.0]  # the next clear at +45
    assert [p[0] for p in second[6]] == [1.0, 2.0, 5.0, 10.0, 20.0, 30.0]  # ends at +45
    assert [r[6] for r in open_rows] == [r[6] for r in closed]
    assert second[4] == max(_ts(rec) for rec in records)  # followed to the last batch


def test_same_rows_via_replay_and_via_sockets_and_partial_mid_stream(tmp_path: Any) -> None:
    records = capture()
    # `kvscope replay --store`: the capture through the ingest path, the writer still open.
    replayed = open_writer(StoreConfig(f"sqlite:///{tmp_path / 'replay.sqlite'}"))
    assert replayed is not None
    play_into(StreamIngest(STREAM, can_replay=False, sink=replayed), records)
    assert replayed.flush()
    by_replay = stored_recovery(replayed.engine)

    # Real sockets into the serve pipeline, at the recorded pace (a quarter of it).
    source = CaptureSource(records, speed=0.25)
    try:
        config = Config([ReplicaConfig("lab", source.endpoint, replay=source.replay_endpoint)])
        store = f"sqlite:///{tmp_path / 'serve.sqlite'}"
        with running_pipeline(replace(config, store=StoreConfig(store))) as (collector, writer, _):
            assert writer is not None
            _until(lambda: collector.is_connected(STREAM), "the collector to connect")
            source.play()
            last = records[-1].seq

            def caught_up() -> bool:
                with collector.lock:
                    ingest = collector.ingests[STREAM]
                    return ingest.last_seq == last and not ingest.replaying

            _until(caught_up, "the capture to play")
            assert writer.flush()
            by_sockets = stored_recovery(writer.engine)
            client = TestClient(
                create_app(ApiData(collector=collector, engine=writer.engine, writer=writer))
            )
            listed = client.get("/resets").json()
            detail = client.get(f"/resets/{listed[-1]['id']}").json()
    finally:
        source.close()
    replayed.close()

    assert len(by_replay) == 2 and all(r[6] for r in by_replay)
    assert by_sockets == by_replay  # every point, t50/t90, peak, until: the stream's alone
    # Mid-stream (the pipeline still open) the API says partial, with what was reached.
    assert [r["recovery_complete"] for r in listed] == [False, False]
    assert detail["recovery"] and detail["recovery_complete"] is False
    assert detail["offsets_reached"] == [p["offset_s"] for p in detail["recovery"]]
    assert detail["offsets_reached"] == [p[0] for p in by_replay[1][6]]
    assert detail["recovery_until_ts"] == by_replay[1][4]
    assert listed[-1]["offsets_reached"] == detail["offsets_reached"]


def _ts(record: CaptureRecord) -> float:
    from kvscope.collector.wire import BatchDecoder

    return float(BatchDecoder().decode(record.payload, record.seq).ts)


def _clear_times(records: list[CaptureRecord]) -> list[float]:
    from kvscope.collector.wire import BatchDecoder

    decoder = BatchDecoder()
    return [float(decoder.decode(r.payload, r.seq).ts) for r in records if r.seq in (1055, 1592)]


def _until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
