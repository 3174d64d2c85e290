"""Discovery through `GET /kv_event_sources`, served here by a stdlib HTTP server returning
the shape vLLM 0.33's API server returns (its resolved KVEventsConfig per DP rank): running
vLLM's whole API server needs a model, which this machine cannot serve."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvscope.collector.discovery import DiscoveryError, discover
from kvscope.collector.types import StreamId

SOURCES = {
    "0": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5567",
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "kv",
    },
    "1": {"endpoint": "tcp://10.1.2.3:5558", "replay_endpoint": None, "topic": ""},
}


@pytest.fixture
def api() -> Iterator[tuple[str, dict[str, object]]]:
    state: dict[str, object] = {"body": SOURCES}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/kv_event_sources":
                self.send_error(404)
                return
            body = json.dumps(state["body"]).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def test_each_rank_becomes_a_stream_reachable_from_here(
    api: tuple[str, dict[str, object]],
) -> None:
    url, _ = api
    rank0, rank1 = discover("a", url + "/")
    assert rank0.stream == StreamId("a", 0)
    assert rank0.endpoint == "tcp://127.0.0.1:5557" and not rank0.bind
    assert rank0.replay_endpoint == "tcp://127.0.0.1:5567"
    assert rank0.topic == b"kv"
    assert (rank1.stream, rank1.endpoint, rank1.replay_endpoint) == (
        StreamId("a", 1),
        "tcp://10.1.2.3:5558",
        None,
    )


@pytest.mark.parametrize("body", [{}, [], {"0": {"replay_endpoint": "x"}}])
def test_a_useless_answer_is_a_clear_error(
    api: tuple[str, dict[str, object]], body: object
) -> None:
    url, state = api
    state["body"] = body
    with pytest.raises(DiscoveryError, match="kv_event_sources"):
        discover("a", url)


def test_an_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(DiscoveryError, match="kv_event_sources"):
        discover("a", "http://127.0.0.1:9", timeout_s=1)
