"""A replica's HTTP API, shaped like vLLM's API server (stdlib `ThreadingHTTPServer`, no vLLM).

- `POST /reset_prefix_cache?reset_running_requests=&reset_external=&keep_running_requests=`
  -> 200 `{"success": bool}`; 400 when keep_running_requests is combined with
  reset_running_requests; 422 for a value that is not a boolean (as FastAPI answers).
- `GET /metrics` -> the replica's Prometheus text (vLLM's metric names).
- `GET /kv_event_sources` -> `{"0": {KVEventsConfig fields...}}`.
- `GET /health` -> 200, `GET /version` -> `{"version": ...}`.

Requests are served on their own threads; a reset is handed to the replica's driving thread
through `LabBackend.reset` (a thread-safe queue there) and applied between engine steps.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


class ResetUnavailable(RuntimeError):
    """The replica could not apply a reset (closed, or its engine did not answer in time)."""


class LabBackend(Protocol):
    def http_reset(self, reset_running_requests: bool, reset_external: bool, keep: bool) -> bool:
        """Apply a reset between engine steps; returns its result. May raise ResetUnavailable."""
        ...

    def metrics_text(self) -> bytes: ...

    def event_sources(self) -> dict[str, dict[str, Any]]: ...

    def version(self) -> str: ...


class _BadParam(ValueError):
    pass


def _flag(query: dict[str, list[str]], name: str) -> bool:
    values = query.get(name)
    if not values:
        return False
    value = values[-1].strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _BadParam(name, values[-1])


class LabHTTPServer:
    """Serves one replica's API on `host:port` (port 0: the OS chooses; see `url`)."""

    def __init__(self, backend: LabBackend, host: str = "127.0.0.1", port: int = 0) -> None:
        self.backend = backend
        handler = _handler_for(backend)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        self.host = str(bound_host)
        self.port = int(bound_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"lab-http-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler_for(backend: LabBackend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kvscope-lab"
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, content: object) -> None:
            self._send(status, json.dumps(content).encode(), "application/json")

        def _not_found(self) -> None:
            self._json(404, {"detail": "Not Found"})

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/metrics":
                self._send(200, backend.metrics_text(), PROMETHEUS_CONTENT_TYPE)
            elif path == "/kv_event_sources":
                self._json(200, backend.event_sources())
            elif path == "/health":
                self._send(200, b"", "application/json")
            elif path == "/version":
                self._json(200, {"version": backend.version()})
            elif path == "/reset_prefix_cache":
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                self._not_found()

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            # Drain a body if one was sent, so the connection stays usable.
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            if parts.path != "/reset_prefix_cache":
                self._not_found()
                return
            query = parse_qs(parts.query, keep_blank_values=True)
            try:
                preempt = _flag(query, "reset_running_requests")
                external = _flag(query, "reset_external")
                keep = _flag(query, "keep_running_requests")
            except _BadParam as exc:
                name, value = exc.args
                self._json(
                    422,
                    {
                        "detail": [
                            {
                                "type": "bool_parsing",
                                "loc": ["query", name],
                                "msg": "Input should be a valid boolean, unable to interpret input",
                                "input": value,
                            }
                        ]
                    },
                )
                return
            if keep and preempt:
                self._json(
                    400,
                    {
                        "detail": "keep_running_requests and reset_running_requests cannot "
                        "be combined: one keeps the running requests, the other preempts them"
                    },
                )
                return
            try:
                success = backend.http_reset(preempt, external, keep)
            except ResetUnavailable as exc:
                self._json(503, {"detail": str(exc)})
                return
            self._json(200, {"success": bool(success)})

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

    return Handler
