"""Where each stream is heard: replica endpoints expanded per data-parallel rank.

Endpoint syntax follows CZMQ: a leading `@` means bind (for a vLLM publisher configured with a
concrete `tcp://host:port`, which connects), a leading `>` or nothing means connect.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.collector.engine_kind import Engine
from kvscope.collector.types import StreamId


@dataclass(frozen=True, slots=True)
class StreamEndpoint:
    stream: StreamId
    endpoint: str
    bind: bool
    replay_endpoint: str | None
    topic: bytes = b""
    engine: Engine | None = None
    """Configured; None: told by the stream's batches (collector/engine_kind.py)."""


def offset_port(endpoint: str, rank: int) -> str:
    """The endpoint of `rank`, as vLLM derives it: the rank is added to a TCP port."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"endpoint {endpoint!r} has no port to offset by the DP rank")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    raise ValueError(f"endpoint {endpoint!r}: DP ranks need a tcp:// or inproc:// endpoint")


def parse_endpoint(spec: str) -> tuple[str, bool]:
    """(address, bind) from `@tcp://...`, `>tcp://...` or `tcp://...`."""
    if spec.startswith("@"):
        return spec[1:], True
    return spec.removeprefix(">"), False


def replica_streams(
    replica: str,
    endpoint: str,
    replay_endpoint: str | None = None,
    dp_ranks: int | list[int] = 1,
    topic: str = "",
) -> list[StreamEndpoint]:
    """One `StreamEndpoint` per data-parallel rank of a replica."""
    address, bind = parse_endpoint(endpoint)
    ranks = range(dp_ranks) if isinstance(dp_ranks, int) else dp_ranks
    return [
        StreamEndpoint(
            stream=StreamId(replica, rank),
            endpoint=offset_port(address, rank),
            bind=bind,
            replay_endpoint=offset_port(replay_endpoint, rank) if replay_endpoint else None,
            topic=topic.encode(),
        )
        for rank in ranks
    ]
