"""The composition root: `create_app` wires data sources, settings, routes and metrics."""

from __future__ import annotations

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvscope import __version__
from kvscope.api import errors
from kvscope.api.context import ApiContext, ApiSettings
from kvscope.api.data import ApiData
from kvscope.api.errors import STORE_DOWN, ErrorBody, documented, error_response
from kvscope.api.guards import BodyLimit, UnexpectedErrors
from kvscope.api.metrics import make_registry
from kvscope.api.page import page_router
from kvscope.api.routes_cache import router as cache_router
from kvscope.api.routes_compare import router as compare_router
from kvscope.api.routes_history import router as history_router
from kvscope.api.routes_prefixes import router as prefixes_router
from kvscope.api.routes_resets import router as resets_router
from kvscope.api.schemas import Health


def create_app(data: ApiData, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title="kvscope",
        version=__version__,
        description="What is in each vLLM replica's prefix cache, now and at any past instant; "
        "what each reset did to it and how it recovered.",
        # Any operation may meet an unexpected error (500) or a store that does not answer (503).
        responses=documented(500, 503),
    )
    registry, reset_counter = make_registry(data)
    app.state.kvscope = ApiContext(data, settings, registry, reset_counter)
    errors.install(app)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(UnexpectedErrors)  # added last: the outermost, it sees every error
    app.include_router(page_router)
    app.include_router(cache_router)
    app.include_router(history_router)
    app.include_router(compare_router)  # before /resets/{reset_id}
    app.include_router(resets_router)
    app.include_router(prefixes_router)

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        """kvscope_* metrics (Prometheus text format)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"], response_model=Health)
    async def healthz() -> Health:  # async: nothing to wait for, no hop to a worker thread
        """The process answers."""
        return Health(status="ok")

    @app.get("/readyz", tags=["health"], response_model=Health)
    def readyz() -> Response | Health:
        """Ready once the start-up replays have settled, while the collector runs and the store
        answers (and, with leases, once it knows which streams it holds); else 503 with the
        reason: `starting` (the replays in flight), `collector_down` (its loop stopped:
        nothing is being collected), `store_writer_down` (nothing more is stored),
        `leases_settling` (no lease round completed yet, or the last one failed) or
        `store_unavailable`."""
        collector = data.collector
        if collector is not None:
            if not collector.up:
                why = collector.failure or "the collector's loop is not running"
                return error_response(
                    ErrorBody(status=503, code="collector_down", message="not ready: " + why)
                )
            with collector.lock:
                waiting = [
                    str(s)
                    for s, ingest in collector.ingests.items()
                    if (ingest.replaying and not ingest.checking_tail)
                    or (
                        collector.is_connected(s)
                        and ingest.counters.replays_requested == 0
                        and ingest.can_replay
                    )
                ]
            if waiting:
                replaying = "replaying: " + ", ".join(waiting)
                return error_response(ErrorBody(status=503, code="starting", message=replaying))
        writer = data.writer
        if writer is not None and not writer.up:
            why = writer.failure or "the store's writer thread is not running"
            return error_response(
                ErrorBody(status=503, code="store_writer_down", message="not ready: " + why)
            )
        unsettled = None if data.leases is None else data.leases.unsettled()
        if unsettled is not None:
            return error_response(
                ErrorBody(status=503, code="leases_settling", message="not ready: " + unsettled)
            )
        if not data.store_reachable():
            return error_response(
                ErrorBody(status=503, code="store_unavailable", message="not ready: " + STORE_DOWN)
            )
        return Health(status="ok")

    return app
