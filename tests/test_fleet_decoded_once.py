"""A fleet's message is read once, by its router, and its stream applies the batch straight from
its bytes: what the streams make of a recorded vLLM stream, its batches damaged, repeated,
reordered, restarted, given other ranks or seq frames of other lengths, is what they make of it
decoding each message alone (tests/test_fleet_live_fused.py draws made-up and hostile batches
too); and the rank the router reads is the one `batch_rank` reads."""

from __future__ import annotations

from itertools import islice

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector.capture import read_capture
from kvscope.collector.fleet import FleetSettings, batch_rank
from kvscope.collector.fleet_router import FleetRouter
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from tests.conftest import capture_path
from tests.test_log_columns import SETTINGS

TOPIC = b"kv@10.0.0.5:7000@m"
PAYLOADS = [r.payload for r in islice(read_capture(capture_path("lab_10rps_300s.msgpack.gz")), 200)]
RANKS = st.sampled_from([None, 0, 1, 3, 65_535, 65_536, -1, 2**63 - 1, 1.0, "x"])


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    payload = draw(st.sampled_from(PAYLOADS))
    how = draw(st.sampled_from(["as is", "as is", "rank", "flip", "cut", "trail"]))
    if how == "rank":  # another rank, and perhaps fields a later vLLM may add
        ts, events = msgspec.msgpack.decode(payload)[:2]
        more = draw(st.lists(st.sampled_from([1, None, [1]]), max_size=2))
        return msgspec.msgpack.encode([ts, events, draw(RANKS), *more])
    if how == "flip":
        at = draw(st.integers(0, len(payload) - 1))
        return payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1 :]
    if how == "cut":
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if how == "trail":
        return payload + draw(st.binary(min_size=1, max_size=3))
    return payload


STEPS = st.lists(
    st.tuples(
        payloads(),
        st.sampled_from(["next"] * 6 + ["again", "back", "skip", "restart"]),
        st.sampled_from([8] * 20 + [7, 9]),
    ),
    min_size=1,
    max_size=40,
)


def states(ingest: StreamIngest) -> dict[object, dict[str, object]]:
    """The stream's map, table by table, hash for hash."""
    return {key: table.to_state() for key, table in ingest.map.tables.items()}


@SETTINGS
@given(STEPS)
def test_routed_batches_make_what_each_message_alone_makes(
    steps: list[tuple[bytes, str, int]],
) -> None:
    router = FleetRouter(FleetSettings("tcp://127.0.0.1:5557"))
    streams: dict[StreamId, tuple[StreamIngest, StreamIngest]] = {}
    seq = 0
    for now, (payload, move, seq_bytes) in enumerate(steps):
        seq = {"again": seq - 1, "back": seq - 3, "skip": seq + 3, "restart": 0}.get(move, seq)
        seq = max(seq, 0)
        seq_frame = seq.to_bytes(9, "big")[9 - seq_bytes :]
        frames = [TOPIC, seq_frame, payload]
        to, read = router.route_batch(frames)
        assert to is not None
        assert to.stream.rank == batch_rank(payload)
        if to.stream not in streams:
            streams[to.stream] = tuple(  # type: ignore[assignment]
                StreamIngest(to.stream, can_replay=False) for _ in range(2)
            )
            streams[to.stream][1].fused = None
        routed, alone = streams[to.stream]
        assert routed.live_frames(frames, now, read) == alone.live_frames(frames, now)
        seq += 1
    for routed, alone in streams.values():
        assert states(routed) == states(alone)
        assert routed.counters == alone.counters
        assert (routed.expected, routed.epoch) == (alone.expected, alone.epoch)
        assert routed._degradation.open == alone._degradation.open
