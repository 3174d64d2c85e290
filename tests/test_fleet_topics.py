"""A fleet's topics: the pattern, the replica name, the replay template, the rank, refusals."""

from __future__ import annotations

import msgspec
import pytest

from kvscope.collector import _wire_fast, wire
from kvscope.collector.engine_kind import engine_of
from kvscope.collector.errors import MalformedKind
from kvscope.collector.fleet import FleetError, FleetSettings, TopicPattern, batch_rank
from kvscope.collector.fleet_router import FleetRouter, Refusal
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from tests.fleet_support import message, payload

pytestmark = pytest.mark.vllm

BIND = "tcp://127.0.0.1:5557"


def test_the_default_pattern_reads_llm_d_topics() -> None:
    pattern = TopicPattern(FleetSettings(BIND, replay_template="tcp://{ip}:5558"))
    found = pattern.match(b"kv@10.0.0.5:8000@meta-llama/Llama-3.1-8B")
    assert found is not None
    assert found.replica == "10.0.0.5:8000"
    assert found.replay_endpoint(0) == "tcp://10.0.0.5:5558"
    assert found.replay_endpoint(2) == "tcp://10.0.0.5:5560"  # + the rank, as vLLM binds it
    for topic in (b"kv-events", b"kv@10.0.0.5@llama", b"kv@10.0.0.5:x@m", b"\xff\xfe", b""):
        assert pattern.match(topic) is None, topic


def test_a_pattern_and_format_of_ones_own() -> None:
    settings = FleetSettings(
        BIND,
        topic_pattern=r"(?P<pod>[a-z0-9-]+)\.(?P<ns>[a-z]+)",
        replica_format="{ns}/{pod}",
        replay_template=None,
    )
    found = TopicPattern(settings).match(b"vllm-0.prod")
    assert found is not None and found.replica == "prod/vllm-0"
    assert found.replay_endpoint(0) is None


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (FleetSettings(BIND, topic_pattern="kv@(?P<ip>"), "topic pattern"),
        (FleetSettings(BIND, replica_format="{host}"), "replica format"),
        (FleetSettings(BIND, replay_template="tcp://{ip}:{replay}"), "replay template"),
        (FleetSettings(BIND, replay_template="tcp://{}:5558"), "replay template"),
        (FleetSettings(BIND, replica_format="{ip"), "replica format"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings: FleetSettings, says: str) -> None:
    with pytest.raises(FleetError, match=says):
        TopicPattern(settings)


def test_the_rank_is_read_from_the_batch() -> None:
    assert batch_rank(payload(3)) == 3
    assert batch_rank(payload(None)) == 0
    assert batch_rank(b"\x92\xcb" + bytes(8) + b"\x90") == 0  # [ts, []]: vLLM 0.9, no rank
    assert batch_rank(b"not msgpack") == 0
    assert batch_rank(msgspec.msgpack.encode([1.0, [], 1 << 40])) == 0  # not a DP rank


def test_the_router_registers_each_topic_and_rank_once() -> None:
    router = FleetRouter(FleetSettings(BIND, replay_template="tcp://{ip}:{port}"))
    first = router.route(message(b"kv@10.0.0.5:7000@m", rank=0))
    assert first is not None and first.new
    assert first.stream == StreamId("10.0.0.5:7000", 0)
    assert first.replay_endpoint == "tcp://10.0.0.5:7000"
    again = router.route(message(b"kv@10.0.0.5:7000@m", rank=0, seq=1))
    assert again is not None and not again.new and again.stream == first.stream
    rank1 = router.route(message(b"kv@10.0.0.5:7000@m", rank=1))
    assert rank1 is not None and rank1.new and rank1.stream == StreamId("10.0.0.5:7000", 1)
    assert rank1.replay_endpoint == "tcp://10.0.0.5:7001"
    assert router.registered == 2


def test_a_known_streams_messages_share_one_route() -> None:
    router = FleetRouter(FleetSettings(BIND))
    assert router.route(message(b"kv@10.0.0.5:7000@m", seq=0)) is not None
    second = router.route(message(b"kv@10.0.0.5:7000@m", seq=1))
    third = router.route(message(b"kv@10.0.0.5:7000@m", seq=2))
    assert second is not None and not second.new and second is third  # none made per message


def test_a_routed_batch_is_applied_from_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router reads the batch for its rank, and the stream applies that read straight
    from its bytes: no decode per message but the first (which tells the stream's engine), and
    the map it makes is the one a decode of each batch makes."""
    calls = []

    def counted(payload: bytes, seq: int, max_block_size: int) -> object:
        calls.append(seq)
        return decode(payload, seq, max_block_size)

    decode = _wire_fast.decode_map_batch
    monkeypatch.setattr(wire, "decode_map_batch", counted)
    router = FleetRouter(FleetSettings(BIND))
    routed, alone = None, None
    for seq in range(3):
        frames = message(b"kv@10.0.0.5:7000@m", rank=2, seq=seq)
        calls.clear()
        to, read = router.route_batch(frames)
        assert to is not None and to.stream == StreamId("10.0.0.5:7000", 2)
        assert calls == [] and (read is None) == (seq == 0)  # first: scanned
        routed = routed or StreamIngest(to.stream, can_replay=False)
        if alone is None:
            alone = StreamIngest(to.stream, can_replay=False)
            alone.fused = None
        routed.live_frames(frames, float(seq), read)
        assert calls == ([] if seq else [0])
        calls.clear()
        alone.live_frames(frames, float(seq))
        assert calls == [seq]
    assert routed is not None and alone is not None
    assert routed.map.counts() == alone.map.counts() and routed.map.counts()
    assert routed.counters == alone.counters


def test_a_router_for_streams_with_a_sink_decodes_each_batch_once() -> None:
    """Streams told to a sink want each batch's `Batch`: such a router hands them the batch it
    decoded (the one a decode of their own makes), and they apply it."""
    router = FleetRouter(FleetSettings(BIND), from_bytes=False)
    for seq in range(3):
        frames = message(b"kv@10.0.0.5:7000@m", rank=2, seq=seq)
        to, batch = router.route_batch(frames)
        assert to is not None and to.stream == StreamId("10.0.0.5:7000", 2)
        assert batch == (BatchDecoder().decode(frames[2], seq) if seq else None)  # first: scanned


def test_a_stream_with_stricter_limits_refuses_a_routed_batch() -> None:
    """The router reads with the default limits; a stream whose decoder has others reads the
    batch again, so it refuses what it refuses alone."""
    router = FleetRouter(FleetSettings(BIND))
    strict = IngestLimits(max_block_size=8)
    ingests = []
    for fused in (True, False):
        ingest = StreamIngest(StreamId("10.0.0.5:7000", 0), can_replay=False)
        ingest.decoder = BatchDecoder(strict)
        if not fused:
            ingest.fused = None
        for seq in range(3):
            frames = message(b"kv@10.0.0.5:7000@m", rank=0, seq=seq)
            to, read = router.route_batch(frames)
            assert to is not None
            ingest.live_frames(frames, float(seq), read)
        ingests.append(ingest)
    refused = ingests[0].counters.malformed
    assert refused == ingests[1].counters.malformed
    assert refused[MalformedKind.LIMIT_EXCEEDED] == 3


def test_the_router_counts_what_it_refuses() -> None:
    router = FleetRouter(FleetSettings(BIND, max_publishers=2), taken=[StreamId("10.0.0.9:1", 0)])
    assert router.route(message(b"kv-events")) is None
    assert router.route([b"kv@10.0.0.1:1@m"]) is None
    assert router.route(message(b"kv@10.0.0.9:1@m")) is None  # a configured replica's name
    assert router.route(message(b"kv@10.0.0.1:1@m")) is not None
    assert router.route(message(b"kv@10.0.0.1:1@other")) is None  # same replica, other topic
    assert router.route(message(b"kv@10.0.0.2:1@m")) is not None
    for i in range(100):  # hostile topics: none registered past the cap
        assert router.route(message(f"kv@10.1.0.{i}:1@m".encode())) is None
    assert router.registered == 2
    assert router.refused == {
        Refusal.UNMATCHED: 1,
        Refusal.FRAME_COUNT: 1,
        Refusal.NAME_TAKEN: 2,
        Refusal.FULL: 100,
    }


def test_a_vllm_batch_tells_its_engine() -> None:
    stored = payload(0)
    events = BatchDecoder().decode(stored, 0).events
    assert engine_of(stored, events) == "vllm"
    assert engine_of(stored, []) is None


def test_a_forgotten_stream_routes_as_new_and_its_topics_other_rank_stays() -> None:
    router = FleetRouter(FleetSettings(BIND))
    rank0, rank1 = StreamId("10.0.0.5:7000", 0), StreamId("10.0.0.5:7000", 1)
    for rank in (0, 1):
        first = router.route(message(b"kv@10.0.0.5:7000@m", rank=rank))
        assert first is not None and first.new
    router.forget(rank0, Refusal.LEASED)
    assert router.registered == 1 and router.refused == {Refusal.LEASED: 1}
    kept = router.route(message(b"kv@10.0.0.5:7000@m", rank=1, seq=1))
    assert kept is not None and not kept.new and kept.stream == rank1
    again = router.route(message(b"kv@10.0.0.5:7000@m", rank=0, seq=1))
    assert again is not None and again.new and again.stream == rank0
    router.forget(rank0)
    router.forget(rank1)  # the topic's last stream: its publisher is forgotten too
    assert router.registered == 0 and router.refused == {Refusal.LEASED: 1}
    for rank in (1, 0):
        back = router.route(message(b"kv@10.0.0.5:7000@m", rank=rank, seq=2))
        assert back is not None and back.new
    assert router.registered == 2
