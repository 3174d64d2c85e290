"""One error shape for every error response: `{"error": {status, code, message, field}}`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from kvscope.storage.engine import store_down
from kvscope.storage.history import NotInStore

STORE_DOWN = "the store does not answer; try again later"
INTERNAL = "an unexpected error; it is logged on the server"
ONLY_IN_STORE = "known only to the store, which does not answer"


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.body = ErrorBody(status=status, code=code, message=message, field=field)


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for these error statuses, all with the one error shape."""
    return {status: {"model": ErrorResponse} for status in statuses}


def error_response(body: ErrorBody, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        ErrorResponse(error=body).model_dump(), status_code=body.status, headers=headers
    )


_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    422: "invalid",
    500: "internal",
    502: "upstream_error",
    503: "store_unavailable",
    504: "upstream_timeout",
}


def unexpected_body(exc: BaseException) -> ErrorBody:
    """503 `store_unavailable` or 500 `internal`, with nothing of `exc` in it: its text may
    quote SQL, paths or internals."""
    if store_down(exc):
        return ErrorBody(status=503, code="store_unavailable", message=STORE_DOWN)
    return ErrorBody(status=500, code="internal", message=INTERNAL)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.body.status == 401 else None
        return error_response(exc.body, headers)

    @app.exception_handler(NotInStore)
    async def _not_in_store(_request: Request, exc: NotInStore) -> JSONResponse:
        return error_response(ErrorBody(status=404, code="not_in_store", message=str(exc)))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part not in ("query", "body")]
        return error_response(
            ErrorBody(
                status=422,
                code="invalid",
                message=str(first.get("msg", "invalid request")),
                field=".".join(location) or None,
            )
        )

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException) -> JSONResponse:
        # Its headers are part of the answer: `Allow` on a 405, for one.
        return error_response(
            ErrorBody(
                status=exc.status_code,
                code=_CODES.get(exc.status_code, "error"),
                message=str(exc.detail),
            ),
            exc.headers,
        )
