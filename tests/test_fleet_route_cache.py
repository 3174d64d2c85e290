"""The router's cache of known routes (collector/_fleet_route.pyx): each message of a known
topic and rank finds its route there, never another's, whatever the topics share, however
their routes come and go."""

from __future__ import annotations

from kvscope.collector.fleet import FleetSettings
from kvscope.collector.fleet_router import FleetRouter, Refusal, Route
from kvscope.collector.types import StreamId
from tests.fleet_support import message

BIND = "tcp://127.0.0.1:5557"


def _known(router: FleetRouter, frames: list[bytes]) -> Route:
    route = router.route(frames)
    assert route is not None and not route.new
    return route


def _heard(router: FleetRouter, topics: list[bytes], ranks: tuple[int, ...] = (0,)) -> None:
    for topic in topics:
        for rank in ranks:
            first = router.route(message(topic, rank=rank))
            assert first is not None and first.new


def test_topics_that_share_bytes_route_each_to_its_own_stream() -> None:
    topics = [
        b"kv@10.0.0.1:7000@m",
        b"kv@10.0.0.1:7000@n",  # the same length, one byte apart
        b"kv@10.0.0.1:7001@m",
        b"kv@10.0.0.1:70000@m",  # longer, the others' prefix and more
        b"kv@10.0.0.11:7000@m",
    ]
    whole = FleetSettings(BIND, topic_pattern=r"(?P<replica>kv@.*)", replica_format="{replica}")
    router = FleetRouter(whole)  # each topic its own replica
    _heard(router, topics)
    for seq in range(1, 4):
        for topic in topics:
            # A new bytes object each time too: the same bytes find the same route.
            for frames in (message(topic, seq=seq), message(bytes(bytearray(topic)), seq=seq)):
                route = _known(router, frames)
                assert route.stream == StreamId(topic.decode(), 0)


def test_ranks_of_one_topic_take_turns_without_mixing() -> None:
    router = FleetRouter(FleetSettings(BIND))
    _heard(router, [b"kv@10.0.0.5:7000@m"], ranks=(0, 1, 2))
    for seq in range(1, 4):
        for rank in (0, 1, 2, 1, 0):
            route = _known(router, message(b"kv@10.0.0.5:7000@m", seq=seq, rank=rank))
            assert route.stream == StreamId("10.0.0.5:7000", rank)
    assert router.registered == 3


def test_a_forgotten_stream_is_not_routed_from_the_cache() -> None:
    router = FleetRouter(FleetSettings(BIND))
    topic = b"kv@10.0.0.5:7000@m"
    _heard(router, [topic], ranks=(0, 1))
    old = _known(router, message(topic, seq=1, rank=0))  # routed (and cached) as known
    _known(router, message(topic, seq=1, rank=1))
    router.forget(StreamId("10.0.0.5:7000", 0), Refusal.LEASED)
    back = router.route(message(topic, seq=2, rank=0))
    assert back is not None and back.new  # registered afresh, not the forgotten route
    again = _known(router, message(topic, seq=3, rank=0))
    assert again is not old and again.stream == old.stream
    assert _known(router, message(topic, seq=2, rank=1)).stream == StreamId("10.0.0.5:7000", 1)
    for stream in (StreamId("10.0.0.5:7000", 0), StreamId("10.0.0.5:7000", 1)):
        router.forget(stream)  # the topic's last stream: the topic is not followed
    assert router.registered == 0
    first = router.route(message(topic, seq=4, rank=1))
    assert first is not None and first.new


def test_many_topics_in_turn_each_find_their_own() -> None:
    # More topics than the cache has places: some share one, and take it from each other.
    topics = [f"kv@10.0.{i // 250}.{i % 250}:7000@m".encode() for i in range(3000)]
    router = FleetRouter(FleetSettings(BIND, max_publishers=len(topics)))
    _heard(router, topics)
    for seq in (1, 2):
        for topic in topics:
            route = _known(router, message(topic, seq=seq))
            assert route.stream == StreamId(topic.split(b"@")[1].decode(), 0)


def test_a_refused_topic_stays_refused() -> None:
    router = FleetRouter(FleetSettings(BIND, max_publishers=1))
    _heard(router, [b"kv@10.0.0.5:7000@m"])
    for seq in (1, 2, 3):
        assert router.route(message(b"kv@10.0.0.6:7000@m", seq=seq)) is None
        assert router.route(message(b"other", seq=seq)) is None
        _known(router, message(b"kv@10.0.0.5:7000@m", seq=seq))
    assert router.refused == {Refusal.FULL: 3, Refusal.UNMATCHED: 3}
