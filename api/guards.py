"""What every request passes through: the body limit, and an answer for every unexpected error.

Plain ASGI: Starlette's `@app.middleware("http")` runs every request through a task and memory
streams, which cost as much as the rest of a GET /healthz.
"""

from __future__ import annotations

import logging
import traceback

from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvscope.api.errors import ErrorBody, error_response, unexpected_body
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.storage.engine import store_down
from kvscope.storage.redact import redact

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger, interval_s=60.0)


class BodyTooLarge(HTTPException):
    """Raised by the wrapped `receive` once a body passes the limit.

    An HTTPException, so that FastAPI's body reading lets it through as it is (any other error
    there becomes a 400) and the app's HTTPException handler answers it in the error shape.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request bodies are limited to {max_bytes} bytes")

    def body(self) -> ErrorBody:
        return ErrorBody(status=413, code="too_large", message=str(self.detail))


class BodyLimit:
    """Refuses a body longer than `max_bytes` with 413: by its declared length before it is
    read, and by the bytes actually received as they arrive (a chunked body declares none).
    Nothing is buffered here: the count stops the read one message past the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and not declared.isdigit():
            invalid = ErrorBody(status=400, code="bad_request", message="invalid Content-Length")
            await error_response(invalid)(scope, receive, send)
            return
        if declared is not None and int(declared) > self.max_bytes:
            await error_response(BodyTooLarge(self.max_bytes).body())(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class UnexpectedErrors:
    """Answers what no exception handler did: 503 `store_unavailable` when the store does not
    answer, else 500 `internal`; both in the one error shape, with nothing of the exception in
    it. The details go to the log, at most once a minute per kind of error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        received: list[Message] = []

        async def recorded() -> Message:
            message = await receive()
            received.append(message)
            return message

        try:
            try:
                await self.app(scope, recorded, sending)
            except Exception as exc:
                if started or not _read_on_a_dropped_connection(scope, exc):
                    raise
                # The connection died since its last use (a server restart): the pool has
                # let go of its connections, and the read runs again, once, on a new one.
                await self.app(scope, _replayed(received, receive), sending)
        except Exception as exc:
            where = f"{scope.get('method')} {scope.get('path')!r}"
            kind = type(exc).__qualname__
            if isinstance(exc, BodyTooLarge):
                body = exc.body()
            elif store_down(exc):
                said = redact(next(iter(str(exc).splitlines()), ""))
                _log.warning("store:" + kind, "the store does not answer on %s: %s", where, said)
                body = unexpected_body(exc)
            else:
                trace = redact("".join(traceback.format_exception(exc)).rstrip())
                _log.warning("internal:" + kind, "unexpected error on %s\n%s", where, trace)
                body = unexpected_body(exc)
            if not started:  # else the client sees the connection close mid-answer
                await error_response(body)(scope, receive, send)


def _read_on_a_dropped_connection(scope: Scope, exc: Exception) -> bool:
    """Whether `exc` is a read's first statement failing on a pooled connection the server
    dropped (the engine pings only connections idle for a while: storage/engine.py)."""
    return scope.get("method") in ("GET", "HEAD") and bool(
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def _replayed(received: list[Message], receive: Receive) -> Receive:
    """`receive` for a request run again: what the first run received, then the rest."""
    pending = list(received)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
