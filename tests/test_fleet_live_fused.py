"""A fleet's live batch is read once by its router, for its rank, and applied by its stream
straight from its bytes (collector/_replay.pyx's `FusedApply`): on any run of messages,
well-formed or not, the streams must end as streams that decode each batch and apply the
`Batch` (today's path, `fused` None): the same maps slot for slot, counters, errors, replay
requests, seqs, epochs and degraded intervals, and the router the same routes and refusals."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import islice
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.collector.capture import read_capture
from kvscope.collector.fleet import FleetSettings, batch_rank
from kvscope.collector.fleet_router import FleetRouter
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.ingest_fused import SHARED_FUSED
from kvscope.collector.limits import IngestLimits
from kvscope.collector.sink import (
    EVERY_BATCH,
    AppliedBatch,
    ClearedMap,
    DegradedChange,
    EventSink,
    MapReader,
    NullSink,
    Span,
)
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests import test_replay_fused, wire_fast_strategies
from tests.conftest import capture_path
from tests.test_replay_fused import map_state
from tests.wire_fast_support import MAX_BS, pack

TOPICS = [b"kv@10.0.0.5:7000@m", b"kv@10.0.0.6:7000@m", b"kv-events"]
"""The first publisher has no replay socket, the second has one; the third topic is unmatched."""
CAPTURED = [r.payload for r in islice(read_capture(capture_path("lab_10rps_300s.msgpack.gz")), 120)]
LIMITS = [
    IngestLimits(),
    IngestLimits(max_block_size=MAX_BS),
    IngestLimits(max_blocks_per_stream=40),  # near it: admit counts, and refuses
    IngestLimits(max_tables_per_stream=3),
    IngestLimits(max_token_bytes_per_stream=3000),
]


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """A batch as vLLM sends it (recorded, or made: every event shape, odd ones among them, the
    array layout of vLLM before 0.24, a rank or none), or a hostile one, or one damaged."""
    source = draw(st.integers(0, 9))
    if source < 3:
        payload = draw(st.sampled_from(CAPTURED))
    else:
        value = (
            draw(wire_fast_strategies.batch(wild=source == 9))
            if source >= 7
            else draw(test_replay_fused.batch())
        )
        if draw(st.booleans()):
            payload = msgspec.msgpack.encode(value)
        else:
            payload = pack(value, random.Random(draw(st.integers(0, 2**32))))
    damage = draw(st.sampled_from(["none"] * 6 + ["flip", "cut", "trail"]))
    if damage == "flip" and payload:
        at = draw(st.integers(0, len(payload) - 1))
        return payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1 :]
    if damage == "cut" and payload:
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if damage == "trail":
        return payload + draw(st.binary(min_size=1, max_size=3))
    return payload


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Fewer than the decoder's tests: each example runs a fleet twice."""
STEPS = st.lists(
    st.tuples(
        st.sampled_from(TOPICS[:2] * 4 + TOPICS[2:]),
        payloads(),
        st.sampled_from(["next"] * 8 + ["again", "back", "skip", "restart"]),
        st.sampled_from([8] * 20 + [7, 9]),
        st.sampled_from([3] * 15 + [0, 1, 2, 4]),  # frames a message
    ),
    min_size=1,
    max_size=40,
)


class Told(NullSink):
    """Everything a sink is told, as values (a map is read during the call only)."""

    def __init__(self) -> None:
        self.told: list[object] = []

    def applied(self, batch: AppliedBatch) -> None:
        changes = {key: list(counts) for key, counts in batch.changes.items()}
        fields = (batch.stream, batch.epoch, batch.seq, batch.ts, batch.recv_ts, batch.payload)
        self.told.append(("applied", fields, batch.batch, changes, batch.gaps))

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        self.told.append(("instant", stream, ts, view.totals()))
        return EVERY_BATCH if len(self.told) % 3 else Span(ts, ts + 2.0)

    def map_cleared(self, cleared: ClearedMap) -> None:
        told = (cleared.epoch, cleared.reason, cleared.seq, cleared.ts, cleared.degraded)
        self.told.append(("cleared", told, cleared.recv_ts, sorted(cleared.tables, key=str)))

    def degraded(self, change: DegradedChange) -> None:
        self.told.append(("degraded", change))


def stream_state(ingest: StreamIngest) -> dict[str, Any]:
    return {
        "map": map_state(ingest.map),
        "counters": ingest.counters,
        "seq": (ingest.expected, ingest.last_seq, ingest.epoch, ingest.engine),
        "degraded": (ingest.degraded, ingest.degraded_history),
        "restarts": list(ingest.restarts_at),
        "layouts": ingest.decoder._order,
        "told": getattr(ingest.sink, "told", None),
    }


def run(
    steps: list[tuple[bytes, bytes, str, int, int]],
    limits: IngestLimits,
    fused: bool,
    sink: bool | Callable[[], EventSink] = False,
) -> tuple[list[object], dict[StreamId, dict[str, Any]], object, int]:
    """What a fleet makes of `steps`: each message's answer, each stream's state, the router's
    refusals, and how many batches were applied straight from their bytes. `sink`: each stream
    tells one (a `Told`, or the one this makes)."""
    make_sink = sink if callable(sink) else Told if sink else None
    # Today's path: the router decodes each batch of a followed topic, the stream applies it.
    router = FleetRouter(FleetSettings("tcp://127.0.0.1:5557"), from_bytes=fused)
    streams: dict[StreamId, StreamIngest] = {}
    shared = SHARED_FUSED  # what a stream applies from bytes with, but the router's read
    before = shared.taken if shared is not None else 0
    seqs = dict.fromkeys(TOPICS, 0)
    answers: list[object] = []
    for now, (topic, payload, move, seq_bytes, count) in enumerate(steps):
        seq = seqs[topic]
        seq = {"again": seq - 1, "back": seq - 3, "skip": seq + 3, "restart": 0}.get(move, seq)
        seq = max(seq, 0)
        frames = [topic, seq.to_bytes(9, "big")[9 - seq_bytes :], payload]
        frames = frames[:count] if count <= 3 else [*frames, b""]
        to, read = router.route_batch(frames)
        if to is None:
            answers.append(None)
            continue
        assert to.stream.rank == batch_rank(payload)
        if to.new:
            ingest = streams[to.stream] = StreamIngest(
                to.stream, can_replay=topic == TOPICS[1], sink=make_sink and make_sink()
            )
            ingest.decoder = BatchDecoder(limits)
            ingest.map.limits = limits
            if not fused:
                ingest.fused = None
        answers.append(streams[to.stream].live_frames(frames, float(now), read))
        answers.append(streams[to.stream].tick(float(now)))
        seqs[topic] = seq + 1
    taken = shared.taken - before if shared is not None else 0
    if router._reader is not None:
        taken += router._reader.taken  # the batches it read that their streams applied
    return answers, {k: stream_state(v) for k, v in streams.items()}, router.refused, taken


@SETTINGS
@given(STEPS, st.sampled_from(LIMITS), st.booleans())
def test_a_fleet_applying_from_bytes_ends_as_one_decoding_each_batch(
    steps: list[tuple[bytes, bytes, str, int, int]], limits: IngestLimits, sink: bool
) -> None:
    answers, states, refused, taken_fused = run(steps, limits, True, sink)
    answers_today, states_today, refused_today, taken = run(steps, limits, False, sink)
    assert taken == 0
    if sink:  # a sink takes no batch off the path from bytes (a stream with other limits
        # than the router's reads the batch again, where with no sink it decodes it)
        assert taken_fused >= run(steps, limits, True, False)[3]
    assert refused == refused_today  # the router's
    assert states.keys() == states_today.keys()
    for stream, state in states_today.items():
        assert states[stream] == state, stream
    assert answers == answers_today


def test_a_recorded_stream_is_applied_from_its_bytes_after_its_first_batch() -> None:
    """vLLM 0.33's batches, as a fleet hears them from two publishers: each batch but a stream's
    first (which tells its engine) is applied straight from its bytes, to the same maps."""
    steps = [(topic, payload, "next", 8, 3) for payload in CAPTURED for topic in TOPICS[:2]]
    fused, today = run(steps, IngestLimits(), True), run(steps, IngestLimits(), False)
    assert fused[:3] == today[:3]
    stores_at = next(i for i, p in enumerate(CAPTURED) if b"BlockStored" in p)
    assert fused[3] == 2 * (len(CAPTURED) - stores_at - 1)


def test_a_recorded_stream_told_to_a_sink_is_applied_from_its_bytes() -> None:
    """The same with a sink on each stream: it is told the same calls (`instant` before the
    batches it asks to see the map before, `applied` with the same changes and `Batch`)."""
    steps = [(topic, payload, "next", 8, 3) for payload in CAPTURED for topic in TOPICS[:2]]
    fused, today = run(steps, IngestLimits(), True, True), run(steps, IngestLimits(), False, True)
    assert fused[:3] == today[:3]
    stores_at = next(i for i, p in enumerate(CAPTURED) if b"BlockStored" in p)
    assert fused[3] == 2 * (len(CAPTURED) - stores_at - 1)
    told = [state["told"] for state in fused[1].values()]
    assert all(sum(t[0] == "instant" for t in calls) > 3 for calls in told)


def test_a_clear_applied_from_bytes_makes_a_degraded_map_known_at_its_seq() -> None:
    store = {"type": "BlockStored", "block_hashes": [1, 2], "block_size": 0, "group_idx": 0}
    clear = {"type": "AllBlocksCleared"}
    steps = [
        (TOPICS[0], msgspec.msgpack.encode([1.0, events]), "next", 8, 3)
        for events in ([store], [store], [clear, store], [store])
    ]
    steps[1] = (*steps[1][:2], "skip", 8, 3)  # a gap, not replayed: the map is degraded
    steps[3] = (*steps[3][:2], "skip", 8, 3)  # and again, after the clear
    fused, today = run(steps, IngestLimits(), True), run(steps, IngestLimits(), False)
    assert fused[:3] == today[:3]
    assert fused[3] == 3
    (state,) = fused[1].values()
    assert [i.cleared_at_seq for i in state["degraded"][1]] == [5, None]
