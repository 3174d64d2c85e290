"""What every route reads: the data sources and the settings, injected by `create_app`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter

from kvscope.api.data import ApiData
from kvscope.storage.reset_links import LINK_WINDOW_S
from kvscope.storage.reset_prefixes import PrefixesCache
from kvscope.storage.token_text import TokenText


@dataclass(frozen=True)
class ApiSettings:
    api_token: str | None = None
    """Bearer token for mutating endpoints; without one they are disabled (403)."""
    replica_urls: dict[str, str] = field(default_factory=dict)
    """replica -> its vLLM API server base URL (where POST /reset_prefix_cache lives)."""
    reset_timeout_s: float = 10.0
    max_body_bytes: int = 8 * 1024 * 1024
    link_window_s: float = LINK_WINDOW_S
    """How long before a clear arrives a successful reset request may be and still be its cause
    (storage/reset_links.py: the latest such request is linked)."""
    token_text: TokenText | None = None
    """The tokenizer named with --tokenizer: prefix groups' first tokens as text too."""

    def __post_init__(self) -> None:
        if self.api_token is not None and not self.api_token.strip():
            raise ValueError("api_token is empty: no Authorization header could carry it")


@dataclass
class ApiContext:
    data: ApiData
    settings: ApiSettings
    registry: CollectorRegistry
    reset_counter: Counter
    prefixes: PrefixesCache = field(default_factory=PrefixesCache)
    """GET /resets/{id}/prefixes' answers, per reset, while nothing more was reached."""


async def context(request: Request) -> ApiContext:
    # async: FastAPI runs a plain-def dependency in its threadpool, a hop to a worker thread
    # and back (two GIL hand-offs) on every request for one attribute read.
    ctx: ApiContext = request.app.state.kvscope
    return ctx
