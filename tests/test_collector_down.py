"""The collector on real loopback sockets never pretends: a batch that breaks the sink stops
only that batch (every other stream goes on), a tail lost at the end of a stream comes back by
replay after a silence, and a loop that stops anyway shows in /readyz, in
`kvscope_collector_up` and in the exit status of `kvscope collect` and `kvscope serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.cli import app as cli
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, NullSink
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port
from kvscope.storage import batch_log
from kvscope.storage.engine import open_store
from kvscope.storage.resume import resume_point
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer import StoreWriter
from tests.test_subscriber import Replayer, batch, wait_for

GOOD, BAD = StreamId("good", 0), StreamId("bad", 0)


class BreaksOn(NullSink):
    """A store hook with a bug that only one replica's batches meet."""

    def __init__(self, replica: str) -> None:
        self.replica = replica

    def applied(self, batch: AppliedBatch) -> None:
        if batch.stream.replica == self.replica and batch.seq % 2:
            raise ValueError("a bug in the sink")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def publisher(ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[zmq.Socket[bytes], str]:
    port = free_port()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    return pub, f"tcp://127.0.0.1:{port}"


def test_a_batch_that_breaks_the_sink_stops_neither_its_stream_nor_another(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    (good_pub, good_url), (bad_pub, bad_url) = publisher(ctx), publisher(ctx)
    streams = [*replica_streams("good", good_url), *replica_streams("bad", bad_url)]
    with Collector(streams, sink=BreaksOn("bad")) as collector:
        wait_for(lambda: collector.is_connected(GOOD) and collector.is_connected(BAD))
        good, bad = collector.ingests[GOOD], collector.ingests[BAD]
        wait_for(lambda: _subscribed(good_pub, bad_pub, good, bad))
        for seq in range(1, 40):
            for pub in (good_pub, bad_pub):
                pub.send_multipart([b"", seq.to_bytes(8, "big"), batch(seq, seq + 1, parent=seq)])
        wait_for(lambda: good.last_seq == 39 and bad.last_seq == 39)
        with collector.lock:
            assert collector.up
            assert good.counters.ingest_errors == {} and good.degraded is None
            assert good.map.totals().hittable == 40
            assert bad.counters.ingest_errors == {("live", "ValueError"): 20}
            assert bad.degraded is not None
            assert bad.map.totals().blocks == 40  # the map applied; the store's copy did not


def _subscribed(
    good_pub: zmq.Socket[bytes], bad_pub: zmq.Socket[bytes], *ingests: StreamIngest
) -> bool:
    """Seq 0 on both until both have it: a subscription reaches the publisher after the
    handshake (the slow joiner)."""
    for pub in (good_pub, bad_pub):
        pub.send_multipart([b"", (0).to_bytes(8, "big"), batch(0, 1)])
    return all(i.last_seq == 0 for i in ingests)


def test_a_tail_lost_at_the_end_of_a_stream_is_replayed_after_a_silence(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    pub, url = publisher(ctx)
    replay_port = free_port()
    replayer = Replayer(ctx, replay_port, with_topic=True)
    stream = StreamId("r", 0)
    settings = CollectorSettings(tail_check_after_s=0.5)
    try:
        with Collector(
            replica_streams("r", url, f"tcp://127.0.0.1:{replay_port}"), settings=settings
        ) as collector:
            ingest = collector.ingests[stream]
            wait_for(lambda: collector.is_connected(stream) and ingest.counters.replays_ok >= 1)
            # The publisher sends 0..9; the last three never reach the SUB socket.
            for seq in range(10):
                replayer.buffer.append((seq, batch(seq, seq + 1, parent=seq or None)))
            wait_for(lambda: _published_until(pub, ingest, 6))
            wait_for(lambda: ingest.last_seq == 9 and not ingest.replaying)
            with collector.lock:
                assert ingest.map.totals().hittable == 10 and ingest.degraded is None
                assert ingest.counters.tail_checks >= 1 and ingest.counters.gaps == 0
                assert not ingest.tail_unverified(ingest.last_message_at or 0.0)
    finally:
        replayer.close()


def _published_until(pub: zmq.Socket[bytes], ingest: StreamIngest, last: int) -> bool:
    for seq in range(last + 1):
        pub.send_multipart([b"t", seq.to_bytes(8, "big"), batch(seq, seq + 1, parent=seq or None)])
    return ingest.last_seq is not None and ingest.last_seq >= last


def _dies_after(calls: int) -> object:
    """Stands in for the loop's timer step: it raises on its `calls`-th call. No input can
    reach such a failure any more (every message is isolated), so the fault is injected."""
    count = [0]
    original = Collector._tend

    def tend(self: Collector, stream: object, now: float) -> None:
        count[0] += 1
        if count[0] >= calls:
            raise RuntimeError("injected: the loop broke")
        original(self, stream, now)  # type: ignore[arg-type]

    return tend


def test_a_dead_loop_shows_in_readyz_and_metrics(
    ctx: zmq.Context[zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _pub, url = publisher(ctx)
    monkeypatch.setattr(Collector, "_tend", _dies_after(5))
    with Collector(replica_streams("r", url)) as collector:
        client = TestClient(create_app(ApiData(collector=collector), ApiSettings()))
        wait_for(lambda: not collector.up)
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "collector_down"
        assert "injected: the loop broke" in ready.json()["error"]["message"]
        assert "kvscope_collector_up 0.0" in client.get("/metrics").text


@pytest.mark.parametrize("command", ["collect", "serve"])
def test_collect_and_serve_exit_non_zero_after_flushing_the_store(
    command: str,
    ctx: zmq.Context[zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    pub, url = publisher(ctx)
    store = f"sqlite:///{tmp_path / 's.sqlite'}"

    def publishing_then_dying(self: Collector, stream: object, now: float) -> None:
        # Each pass of the loop sends the next batch (again, until it arrives: a repeat is
        # dropped as a duplicate); once 20 are in the map, the loop breaks.
        last = self.ingests[StreamId("r", 0)].last_seq
        if last is not None and last >= 19:
            raise RuntimeError("injected: the loop broke")
        seq = 0 if last is None else last + 1
        pub.send_multipart([b"", seq.to_bytes(8, "big"), batch(seq, seq + 1)])

    monkeypatch.setattr(Collector, "_tend", publishing_then_dying)
    args = [command, "--replica", f"r={url}", "--store", store]
    args += ["--no-live"] if command == "collect" else ["--port", str(free_port())]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "the collector stopped: RuntimeError: injected: the loop broke" in result.output
    point = resume_point(open_store(store), StreamId("r", 0))
    assert point is not None and point.last_seq >= 19  # what was collected was stored


def test_a_row_the_store_refuses_is_left_out_and_the_rest_are_written(tmp_path: Path) -> None:
    """A value SQLite cannot hold (a seq past 2^63, which ingest now refuses before it gets
    here) used to kill the writer thread: nothing more was stored while /readyz said 200.
    The row is put on the writer's queue directly, as no input reaches it any more."""
    engine = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    writer = StoreWriter(engine)
    ingest = StreamIngest(StreamId("r", 0), can_replay=False, sink=writer)
    for seq in range(10):
        if seq == 5:
            writer._queue.put((StreamId("r", 0), 0, 2**64, 5.0, 5.0, b"poison"), True)
        ingest.live_frames([b"", seq.to_bytes(8, "big"), batch(seq, seq + 1)], float(seq))
    assert writer.flush(30)
    assert writer.up and writer.failure is None
    assert writer.stats.rows_refused == 1
    writer.close()
    with engine.connect() as conn:
        assert batch_log.count_batches(conn) == 10


def test_a_dead_writer_shows_in_readyz_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: WriteLoop, rows: list[object]) -> int:
        raise RuntimeError("injected: the writer broke")

    monkeypatch.setattr(WriteLoop, "_write_rows", broken)
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(StreamId("r", 0), can_replay=False, sink=writer)
    ingest.live_frames([b"", bytes(8), batch(0, 1)], 0.0)
    writer.flush(5)
    wait_for(lambda: not writer.up)
    client = TestClient(create_app(ApiData(engine=writer.engine, writer=writer), ApiSettings()))
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "store_writer_down"
    assert "injected: the writer broke" in ready.json()["error"]["message"]
    assert "kvscope_store_writer_up 0.0" in client.get("/metrics").text
