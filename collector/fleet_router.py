"""Which stream a fleet's message belongs to: (topic, DP rank in the batch) -> a `StreamId`.

Socket-free, like the ingest: the collector hands it each message from the fleet's bound SUB
and registers a stream for each new route it returns. The rank is read by the first pass of
collector/_replay.pyx's `FusedApply` over the batch, which the stream then applies straight from
the payload, without a `Batch` in between: each message is read once. What it refuses is
counted by reason and logged at most once per interval per reason (collector/ratelog.py), never
raised.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kvscope.collector._fleet_route import RouteStream, RouteTable
from kvscope.collector._replay import FusedApply
from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.fleet import FleetSettings, Publisher, TopicPattern, batch_rank
from kvscope.collector.limits import DEFAULT_LIMITS
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.replay import SEQ_BYTES
from kvscope.collector.types import Batch, StreamId

logger = logging.getLogger(__name__)

MAX_BLOCK_SIZE = DEFAULT_LIMITS.max_block_size


class Refusal(StrEnum):
    UNMATCHED = "unmatched"
    """The topic does not match the fleet's topic pattern."""
    FULL = "full"
    """`max_publishers` streams are registered already."""
    NAME_TAKEN = "name_taken"
    """Another topic (or a configured replica) already has this replica name and rank."""
    FRAME_COUNT = "frame_count"
    """Not a [topic, seq, payload] message: no topic or batch to route it by."""
    LEASED = "leased"
    """Another collector holds the stream's lease (`--lease`): asked for again every few
    seconds; once it is free, the stream resumes from the store and the replay."""


@dataclass(frozen=True, slots=True)
class Route:
    stream: StreamId
    replay_endpoint: str | None
    new: bool
    """First heard: the collector registers the stream."""
    held: RouteStream = field(default_factory=RouteStream, compare=False, repr=False)
    """The drain's: the stream it last found for this route, and when (each registered stream's
    `Route` is handed out for its every message)."""


class FleetRouter(RouteTable):
    def __init__(
        self, settings: FleetSettings, taken: Iterable[StreamId] = (), from_bytes: bool = True
    ) -> None:
        """`from_bytes`: hand each stream the batch as read, to apply straight from its bytes
        (a sink is told of it without a `Batch`); False: decoded (the tests' path of
        reference)."""
        self.settings = settings
        self.pattern = TopicPattern(settings)
        self.refused: Counter[Refusal] = Counter()
        self._ranks: dict[bytes, dict[int, Route]] = {}
        """Each registered stream's one `Route` (not new), handed out for its every message, by
        topic, then rank: a message's route found without a (topic, rank) tuple built and
        hashed; a topic is here while it has a route (as in `_publishers`)."""
        self._registered = 0
        self._publishers: dict[bytes, Publisher] = {}
        """Matched topics (at most one per registered stream): the regex runs once per topic."""
        self._taken = set(taken)
        self._log = RateLimitedLog(logger)
        self._reader = FusedApply() if from_bytes else None
        """Reads each batch of a followed topic, for its rank and for its stream to apply."""
        self._max_block_size = MAX_BLOCK_SIZE

    @property
    def registered(self) -> int:
        return self._registered

    def route(self, frames: list[bytes]) -> Route | None:
        """The stream of one message, or None (counted) when it belongs to none."""
        return self.route_batch(frames)[0]

    # `route_batch(frames) -> (Route | None, Batch | FusedApply | None)`: `route`, and the
    # batch as the router read it (valid until the next call) or decoded it, if it did, for the
    # stream to apply (`StreamIngest.live_frames`); read or decoded with the default limits (a
    # stream with others reads it again). Its usual case is RouteTable's, in C
    # (collector/_fleet_route.pyx); the rest is `_route_rest`.

    def _route_rest(
        self, frames: list[bytes], rank: int, read: FusedApply | None
    ) -> tuple[Route | None, Batch | FusedApply | None]:
        """`route_batch` for what RouteTable leaves: `rank` as the reader read it, -1 if it
        did not (never read again here: the reader declined it, or its topic is not
        followed); with no reader, the batch of a followed topic is decoded here."""
        if len(frames) != 3:
            self._refuse(Refusal.FRAME_COUNT, frames[0] if frames else b"")
            return None, None
        topic, seq, payload = frames
        decoded: Batch | FusedApply | None = read
        # A topic not yet followed (unmatched, or a publisher's first message, which its
        # stream decodes itself) costs a scan, not a read; a wrong seq frame the stream
        # refuses before reading.
        ranks = self._ranks.get(topic)
        if ranks is not None and self._reader is None and len(seq) == SEQ_BYTES:
            decoded = decode_map_batch(payload, int.from_bytes(seq, "big"), MAX_BLOCK_SIZE)
            if decoded is not None:
                rank = decoded.rank or 0
        if rank < 0:
            rank = batch_rank(payload)
        known = ranks.get(rank) if ranks is not None else None
        if known is not None:
            return known, decoded
        publisher = self._publishers.get(topic) or self.pattern.match(topic)
        if publisher is None:
            self._refuse(Refusal.UNMATCHED, topic)
            return None, None
        if self._registered >= self.settings.max_publishers:
            self._refuse(Refusal.FULL, topic)
            return None, None
        stream = publisher.stream(rank)
        if stream in self._taken:
            self._refuse(Refusal.NAME_TAKEN, topic)
            return None, None
        self._publishers[topic] = publisher
        self._add_route(topic, rank, Route(stream, None, False))
        self._registered += 1
        self._taken.add(stream)
        return Route(stream, publisher.replay_endpoint(rank), True), decoded

    def forget(self, stream: StreamId, why: Refusal | None = None) -> None:
        """The stream is not (or no longer) followed: its next message routes as new."""
        gone = [
            (topic, rank)
            for topic, ranks in self._ranks.items()
            for rank, route in ranks.items()
            if route.stream == stream
        ]
        for topic, rank in gone:
            self._drop_route(topic, rank)
            self._registered -= 1
            if topic not in self._ranks:  # the topic's last stream
                self._publishers.pop(topic, None)
            if why is not None:
                self._refuse(why, topic)
        self._taken.discard(stream)

    def _refuse(self, why: Refusal, topic: bytes) -> None:
        self.refused[why] += 1
        self._log.warning(
            f"fleet:{why}",
            "fleet %s: a message refused (%s), topic %r",
            self.settings.bind,
            why,
            topic[:80],
        )
        return None
