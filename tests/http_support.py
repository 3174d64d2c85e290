"""What the API tests read of an HTTP response, whichever client made it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Response(Protocol):
    """An httpx `Response`, or httpx2's: fastapi's TestClient answers with httpx2's where that
    is installed (vLLM's dependencies bring it), a request to a live server with httpx's."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def json(self) -> Any: ...
