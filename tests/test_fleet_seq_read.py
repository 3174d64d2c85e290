"""A fleet's router reads each message's seq frame with its batch (`FusedApply.route_read`), and
its stream takes the seq from that read (`seq_read`) instead of reading the frame again: the
same seq, and a frame that is not a seq (not 8 bytes, or past vLLM's signed 64 bits) is left to
the stream, which refuses it as it refuses one it reads itself."""

from __future__ import annotations

from itertools import islice

import pytest

from kvscope.collector._replay import FusedApply
from kvscope.collector.capture import read_capture
from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import MAX_BLOCK_SIZE, FleetRouter
from kvscope.collector.ingest import StreamIngest
from tests.conftest import capture_path

TOPIC = b"kv@10.0.0.5:7000@m"
PAYLOAD = next(islice(read_capture(capture_path("lab_10rps_300s.msgpack.gz")), 1)).payload


@pytest.mark.parametrize("seq", [0, 1, 255, 256, 2**32 + 7, 2**63 - 1])
def test_the_router_reads_the_seq_of_the_batch_it_reads(seq: int) -> None:
    reader = FusedApply()
    assert reader.route_read(seq.to_bytes(8, "big"), PAYLOAD, MAX_BLOCK_SIZE) >= 0
    assert reader.seq_read(PAYLOAD) == seq
    assert reader.seq_read(bytes(bytearray(PAYLOAD))) == -1  # an equal batch, not the one read


@pytest.mark.parametrize(
    ("seq_frame", "kind"),
    [
        ((2**63).to_bytes(8, "big"), "seq_range"),
        ((2**64 - 1).to_bytes(8, "big"), "seq_range"),
        (b"\x00" * 7, "seq_length"),
        (b"\x00" * 9, "seq_length"),
    ],
)
def test_a_frame_that_is_not_a_seq_is_refused_by_the_stream(seq_frame: bytes, kind: str) -> None:
    reader = FusedApply()
    assert reader.route_read(seq_frame, PAYLOAD, MAX_BLOCK_SIZE) == -1
    assert reader.seq_read(PAYLOAD) == -1
    router = FleetRouter(FleetSettings("tcp://127.0.0.1:5557"))
    first = [TOPIC, (0).to_bytes(8, "big"), PAYLOAD]
    to, read = router.route_batch(first)
    assert to is not None
    routed, alone = (StreamIngest(to.stream, can_replay=False) for _ in range(2))
    routed.live_frames(first, 0.0, read)
    alone.live_frames(first, 0.0)
    frames = [TOPIC, seq_frame, PAYLOAD]
    to, read = router.route_batch(frames)
    assert read is None
    routed.live_frames(frames, 1.0, read)
    alone.live_frames(frames, 1.0)
    assert routed.counters.malformed == {kind: 1}
    assert routed.counters == alone.counters
    assert routed.counters.batches_applied == 1
