"""The collector's sockets on real loopback ZMQ: directions, topics, replay layouts, bad frames.

The publisher here is a few lines of pyzmq speaking vLLM's framing, because these cases need
frames vLLM never sends (malformed, oversize, the pre-0.26 replay layout). The map against
vLLM's own publisher is proven in test_vllm_integration_*.py.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import zmq

from kvscope.collector.endpoints import replica_streams
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_socket import GATHER_S
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import END_SEQ
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.ports import free_port

STREAM = StreamId("r", 0)


def batch(seq: int, *hashes: int, parent: int | None = None) -> bytes:
    event = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": [seq] * 16 * len(hashes),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return msgspec.msgpack.encode([float(seq), [event], 0])


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class Replayer:
    """A ROUTER answering replay requests from a buffer, in the old or the new layout."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], port: int, with_topic: bool) -> None:
        self.buffer: list[tuple[int, bytes]] = []
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{port}")
        self.with_topic = with_topic
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            identity, _, start = self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            topic = [b"t"] if self.with_topic else []
            end_topic = [b""] if self.with_topic else []
            for seq, payload in list(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    self.router.send_multipart(
                        [identity, b"", *topic, seq.to_bytes(8, "big"), payload]
                    )
            self.router.send_multipart([identity, b"", *end_topic, END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.router.close(linger=0)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


def ingest_of(collector: Collector) -> StreamIngest:
    return collector.ingests[STREAM]


@pytest.mark.parametrize("with_topic", [True, False], ids=["vllm>=0.26", "vllm<0.26"])
def test_slow_joiner_losses_and_gaps_come_back_by_replay(
    ctx: zmq.Context[zmq.Socket[bytes]], with_topic: bool
) -> None:
    port, replay_port = free_port(), free_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    replayer = Replayer(ctx, replay_port, with_topic)
    # Published before anyone listens: only the replay can bring these.
    for seq in range(3):
        replayer.buffer.append((seq, batch(seq, 100 + seq)))
    streams = replica_streams("r", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}")
    try:
        with Collector(streams, settings=CollectorSettings(replay_timeout_s=2)) as collector:
            ingest = ingest_of(collector)
            wait_for(lambda: ingest.last_seq == 2 and not ingest.replaying)
            # seq 3 is lost in transit; seq 4 arrives and the gap is replayed.
            replayer.buffer.append((3, batch(3, 103)))
            replayer.buffer.append((4, batch(4, 104)))
            pub.send_multipart([b"t", (4).to_bytes(8, "big"), batch(4, 104)])
            wait_for(lambda: ingest.last_seq == 4 and not ingest.replaying)
            with collector.lock:
                assert {h for h, _ in ingest.map.counts()} == {100, 101, 102, 103, 104}
                assert ingest.degraded is None
                assert ingest.counters.gaps == 1 and ingest.counters.replays_ok == 2
            assert replayer.requests == [0, 3]
    finally:
        replayer.close()
        pub.close(linger=0)


def test_collector_binds_for_a_publisher_that_connects(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    port = free_port()
    streams = replica_streams("r", f"@tcp://127.0.0.1:{port}")
    with Collector(streams) as collector:
        pub = ctx.socket(zmq.PUB)
        pub.connect(f"tcp://127.0.0.1:{port}")
        try:
            wait_for(lambda: collector.is_connected(STREAM))
            time.sleep(0.2)  # the subscription travels after the handshake
            for seq in range(3):
                pub.send_multipart([b"", seq.to_bytes(8, "big"), batch(seq, seq + 1)])
            ingest = ingest_of(collector)
            wait_for(lambda: ingest.last_seq == 2)
            with collector.lock:
                assert ingest.map.totals().blocks == 3 and ingest.degraded is None
        finally:
            pub.close(linger=0)
        wait_for(lambda: not collector.is_connected(STREAM))


def test_topic_filter_and_bad_frames_over_the_wire(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    port = free_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    streams = replica_streams("r", f"tcp://127.0.0.1:{port}", topic="kv")
    settings = CollectorSettings(max_message_bytes=4096)
    try:
        with Collector(streams, settings=settings) as collector:
            wait_for(lambda: collector.is_connected(STREAM))
            time.sleep(0.2)
            ingest = ingest_of(collector)
            sends: list[list[Any]] = [
                [b"kv", (0).to_bytes(8, "big"), batch(0, 1)],
                [b"other", (1).to_bytes(8, "big"), batch(1, 66)],  # filtered out by topic
                [b"kv", b"\x01"],  # two frames
                [b"kv", b"\x00\x01", batch(1, 2)],  # 2-byte seq
                [b"kv", (1).to_bytes(8, "big"), b"\xc1"],  # undecodable
                [b"kv", (2).to_bytes(8, "big"), batch(2, 2, parent=1)],
            ]
            for frames in sends:
                pub.send_multipart(frames)
            wait_for(lambda: ingest.last_seq == 2)
            with collector.lock:
                assert {h for h, _ in ingest.map.counts()} == {1, 2}
                assert dict(ingest.counters.malformed) == {
                    "frame_count": 1,
                    "seq_length": 1,
                    "undecodable_payload": 1,
                }
                assert ingest.degraded is not None  # seq 1's changes are unknown
            # Oversize: libzmq drops the connection; the collector reconnects and goes on.
            pub.send_multipart([b"kv", (3).to_bytes(8, "big"), b"\x00" * 10_000])
            wait_for(lambda: collector.connection_counts(STREAM)[1] >= 1)
            wait_for(lambda: collector.is_connected(STREAM))
            time.sleep(0.3)
            pub.send_multipart([b"kv", (4).to_bytes(8, "big"), batch(4, 4, parent=2)])
            wait_for(lambda: ingest.last_seq == 4)
            with collector.lock:
                assert 4 in {h for h, _ in ingest.map.counts()}
                assert ingest.counters.missing_batches >= 1  # seq 3 never arrived
    finally:
        pub.close(linger=0)


def test_what_was_allocated_before_the_loop_is_kept_out_of_full_collections() -> None:
    """The modules, settings and store a collector starts with live as long as it does: a full
    collection that walked them all held the GIL while batches waited."""
    gc.unfreeze()
    started_with = [object()]  # a container allocated before the collector starts
    assert gc.is_tracked(started_with)
    try:
        with Collector([]):
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_fleet_drained_empty_is_left_to_gather_before_the_next_poll(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Each wake-up costs the loop and libzmq's signalling: once the fleet's socket is empty,
    the loop waits out the rest of `GATHER_S` so that the next wake-up takes what many
    publishers sent."""
    port = free_port()
    collector = Collector([], fleet=FleetSettings(f"tcp://127.0.0.1:{port}"))
    waits: list[float | None] = []
    wait = collector._stop.wait

    def recorded(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return wait(timeout)

    collector._stop.wait = recorded  # type: ignore[method-assign]
    pub = ctx.socket(zmq.PUB)
    try:
        with collector:
            pub.connect(f"tcp://127.0.0.1:{port}")
            stream = StreamId("10.0.0.5:8000", 0)
            for seq in range(50):  # until the subscription has reached the publisher
                pub.send_multipart([b"kv@10.0.0.5:8000@m", seq.to_bytes(8, "big"), batch(seq)])
                if stream in collector.ingests:
                    break
                time.sleep(0.1)
            wait_for(lambda: stream in collector.ingests)
            assert any(w is not None and 0 <= w <= GATHER_S for w in waits)
    finally:
        pub.close(linger=0)
