"""Fleets (bind mode): many publishers that connect to one bound SUB socket, told apart by topic.

In KServe and llm-d deployments each vLLM pod's PUB socket connects to one address and names
itself in its topic, `kv@<pod-ip>:<port>@<model>`. `FleetSettings` says how to read a topic:
`topic_pattern` (a regex with named groups) must match it whole, `replica_format` builds the
replica name from the groups, and `replay_template` the publisher's replay endpoint (vLLM's
replay ROUTER always binds, on the pod). Each (topic, DP rank in the batch) is one stream.

    pattern = TopicPattern(FleetSettings(bind="tcp://0.0.0.0:5557"))
    pattern.match(b"kv@10.0.0.5:8000@llama")  # Publisher(replica="10.0.0.5:8000", ...)
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Protocol

import msgspec

from kvscope.collector._batch_rank import scan_rank
from kvscope.collector.endpoints import offset_port
from kvscope.collector.sink import ResumePoint
from kvscope.collector.types import Batch, StreamId

DEFAULT_TOPIC_PATTERN = r"kv@(?P<ip>[^@]+):(?P<port>\d+)@(?P<model>.+)"
"""The llm-d / KServe topic: `kv@<pod-ip>:<port>@<model>`."""
DEFAULT_REPLICA_FORMAT = "{ip}:{port}"
DEFAULT_GONE_AFTER_S = 60.0
DEFAULT_MAX_PUBLISHERS = 4096


class FleetError(ValueError):
    """Fleet settings kvscope cannot use; the message names the setting."""


@dataclass(frozen=True, slots=True)
class FleetSettings:
    bind: str
    """The address the SUB socket binds (`tcp://0.0.0.0:5557`); publishers connect to it."""
    topic_pattern: str = DEFAULT_TOPIC_PATTERN
    replica_format: str = DEFAULT_REPLICA_FORMAT
    """The replica name, a `str.format` of the pattern's named groups."""
    replay_template: str | None = None
    """Each publisher's replay endpoint from the same groups (`tcp://{ip}:5558`); None: no
    replay, a gap leaves the map degraded. The DP rank is added to its port, as vLLM does."""
    gone_after_s: float = DEFAULT_GONE_AFTER_S
    """A publisher silent this long is shown as gone (kept, and revived if it speaks again)."""
    dp_ranks: int = 1
    """Ports bound, from `bind`'s up: vLLM's DP rank r connects to the given port + r."""
    max_publishers: int = DEFAULT_MAX_PUBLISHERS
    """Streams registered at most: topics past it are refused, so hostile topics cannot grow
    memory without bound."""


@dataclass(frozen=True, slots=True)
class Publisher:
    """What a topic says: the stream's replica name and its replay endpoint (before the rank)."""

    replica: str
    replay: str | None

    def stream(self, rank: int) -> StreamId:
        return StreamId(self.replica, rank)

    def replay_endpoint(self, rank: int) -> str | None:
        return None if self.replay is None else offset_port(self.replay, rank)


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


class TopicPattern:
    """Topics read through `FleetSettings`; the settings are checked at construction."""

    def __init__(self, settings: FleetSettings) -> None:
        try:
            self._regex = re.compile(settings.topic_pattern)
        except re.error as exc:
            raise FleetError(f"topic pattern {settings.topic_pattern!r}: {exc}") from exc
        groups = set(self._regex.groupindex)
        for what, template in (
            ("replica format", settings.replica_format),
            ("replay template", settings.replay_template),
        ):
            if template is None:
                continue
            try:
                missing = _fields(template) - groups
            except ValueError as exc:
                raise FleetError(f"{what} {template!r}: {exc}") from exc
            if missing or any(not name for name in _fields(template)):
                raise FleetError(
                    f"{what} {template!r} names {sorted(missing) or ['{}']}, which the topic "
                    f"pattern does not capture (its groups: {sorted(groups)})"
                )
        self._replica_format = settings.replica_format
        self._replay_template = settings.replay_template

    def match(self, topic: bytes) -> Publisher | None:
        """The publisher a topic names, or None when it does not match (or is not UTF-8)."""
        try:
            text = topic.decode()
        except UnicodeDecodeError:
            return None
        found = self._regex.fullmatch(text)
        if found is None:
            return None
        groups = {k: v or "" for k, v in found.groupdict().items()}
        replica = self._replica_format.format(**groups)
        if not replica:
            return None
        replay = None if self._replay_template is None else self._replay_template.format(**groups)
        return Publisher(replica, replay)


class _ArrayRank(msgspec.Struct, array_like=True):
    ts: msgspec.Raw
    events: msgspec.Raw
    data_parallel_rank: int | None = None


class _MapRank(msgspec.Struct):
    data_parallel_rank: int | None = None


_RANK_DECODERS = (msgspec.msgpack.Decoder(_ArrayRank), msgspec.msgpack.Decoder(_MapRank))
MAX_RANK = 1 << 16
"""A rank past this is not a DP rank (a hostile batch): counted as rank 0's, where the
ingest's own checks see it."""


def batch_rank(payload: bytes, decoded: Batch | None = None) -> int:
    """The DP rank a batch names (its events skipped, not decoded); 0 when it names none or
    cannot be read: the ingest then counts the batch as malformed on rank 0's stream.
    `decoded`: what the compiled decoder made of `payload`, if it took it: its rank is the one
    msgspec reads, within wire_rules' bound (below MAX_RANK)."""
    if decoded is not None:
        return decoded.rank or 0
    scanned = scan_rank(payload, MAX_RANK)  # vLLM's shape, without msgspec's structs
    if scanned >= 0:
        return scanned
    return decoded_rank(payload)


def decoded_rank(payload: bytes) -> int:
    """`batch_rank` by msgspec's decoders: the rule for every payload the scan declines."""
    for decoder in _RANK_DECODERS:
        try:
            rank = decoder.decode(payload).data_parallel_rank
        except (msgspec.DecodeError, RecursionError):
            continue
        return rank if rank is not None and 0 <= rank < MAX_RANK else 0
    return 0


class NotNow(Exception):
    """A stream that must not be followed yet (another collector holds its lease)."""


class StreamStarter(Protocol):
    """Where a stream first heard mid-run starts: the store's resume point, if it keeps one;
    `NotNow` if it must not be followed yet (its message is refused, and the next one asks
    again)."""

    def resume_point(self, stream: StreamId) -> ResumePoint | None: ...
