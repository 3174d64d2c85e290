"""The composition root: `create_app` wires data sources, settings, routes and metrics."""

from __future__ import annotations

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from kvscope import __version__
from kvscope.api import errors
from kvscope.api.context import ApiContext, ApiSettings
from kvscope.api.data import ApiData
from kvscope.api.errors import ErrorBody, error_response
from kvscope.api.metrics import make_registry
from kvscope.api.page import page_router
from kvscope.api.routes_cache import router as cache_router
from kvscope.api.routes_history import router as history_router
from kvscope.api.routes_resets import router as resets_router
from kvscope.api.schemas import Health


class BodyLimit:
    """Refuses a body longer than `max_bytes` (413) by its declared length, before it is read.

    Plain ASGI: Starlette's `@app.middleware("http")` runs every request through a task and
    memory streams, ~0.2 ms a request, as much as the rest of a GET /healthz.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
            if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
                response = error_response(
                    ErrorBody(
                        status=413,
                        code="too_large",
                        message=f"request bodies are limited to {self.max_bytes} bytes",
                    )
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(data: ApiData, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title="kvscope",
        version=__version__,
        description="What is in each vLLM replica's prefix cache, now and at any past instant; "
        "what each reset did to it and how it recovered.",
    )
    registry, reset_counter = make_registry(data)
    app.state.kvscope = ApiContext(data, settings, registry, reset_counter)
    errors.install(app)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(page_router)
    app.include_router(cache_router)
    app.include_router(history_router)
    app.include_router(resets_router)

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        """kvscope_* metrics (Prometheus text format)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"], response_model=Health)
    async def healthz() -> Health:  # async: nothing to wait for, no hop to a worker thread
        """The process answers."""
        return Health(status="ok")

    @app.get("/readyz", tags=["health"], response_model=Health, responses={503: {"model": Health}})
    def readyz() -> Response | Health:
        """Ready once the start-up replays have settled and the store answers."""
        collector = data.collector
        if collector is not None:
            with collector.lock:
                waiting = [
                    str(s)
                    for s, ingest in collector.ingests.items()
                    if ingest.replaying
                    or (collector.is_connected(s) and ingest.counters.replays_requested == 0
                        and ingest.can_replay)
                ]  # fmt: skip
            if waiting:
                body = Health(status="starting", detail="replaying: " + ", ".join(waiting))
                return JSONResponse(body.model_dump(), status_code=503)
        if not data.store_reachable():
            body = Health(status="unavailable", detail="the store does not answer")
            return JSONResponse(body.model_dump(), status_code=503)
        return Health(status="ok")

    return app
