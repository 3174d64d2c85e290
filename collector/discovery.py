"""A replica's streams as its vLLM API server lists them (`GET /kv_event_sources`, vLLM >= 0.31).

The answer maps each data-parallel rank to its resolved `KVEventsConfig`:
`{"0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "", ...}}`.
A wildcard host means the publisher binds on the server's machine: we connect to the host of
the API URL. A concrete host is where it bound (vLLM resolves `tcp://*:0` to the node's IP).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from kvscope.collector.endpoints import StreamEndpoint
from kvscope.collector.types import StreamId

_WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


class DiscoveryError(RuntimeError):
    """The API server did not give a usable list of event sources."""


def _reachable(endpoint: str, api_host: str) -> str:
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if host in _WILDCARDS:
        host = f"[{api_host}]" if ":" in api_host else api_host
    return f"tcp://{host}:{port}"


def parse_sources(replica: str, api_url: str, sources: object) -> list[StreamEndpoint]:
    if not isinstance(sources, dict) or not sources:
        raise DiscoveryError(f"{api_url}/kv_event_sources: no KV event sources (events off?)")
    api_host = urlsplit(api_url).hostname or "127.0.0.1"
    streams = []
    for rank_key, config in sorted(sources.items(), key=lambda kv: int(kv[0])):
        if not isinstance(config, dict) or not isinstance(config.get("endpoint"), str):
            raise DiscoveryError(f"{api_url}/kv_event_sources: rank {rank_key} has no endpoint")
        replay = config.get("replay_endpoint")
        streams.append(
            StreamEndpoint(
                stream=StreamId(replica, int(rank_key)),
                endpoint=_reachable(config["endpoint"], api_host),
                bind=False,
                replay_endpoint=_reachable(replay, api_host) if isinstance(replay, str) else None,
                topic=str(config.get("topic") or "").encode(),
            )
        )
    return streams


def discover(replica: str, api_url: str, timeout_s: float = 5.0) -> list[StreamEndpoint]:
    url = api_url.rstrip("/") + "/kv_event_sources"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.load(response)
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise DiscoveryError(f"{url}: {exc}") from exc
    return parse_sources(replica, api_url.rstrip("/"), body)
