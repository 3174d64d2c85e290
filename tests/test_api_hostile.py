"""Hostile requests get clean refusals: a body past the limit (chunked or not) stops being read,
every error is the one JSON shape with nothing of the server's internals in it, a 405 says
what is allowed, token ids are strict, and the bearer token is compared in constant time.

The API runs over a real SQLite store filled from the bundled capture: in-process where the
ASGI messages are counted, and as a `kvscope api` process where its memory is measured.
"""

from __future__ import annotations

import hmac
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Scope
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.cli import app as cli
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.demo_sources import bundled
from kvscope.lab.ports import free_port
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter
from tests.http_support import Response

LIMIT = ApiSettings().max_body_bytes
ERROR_KEYS = {"status", "code", "message", "field"}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'store.sqlite'}"
    writer = StoreWriter(open_store(url))
    ingest = StreamIngest(StreamId("lab", 0), can_replay=False, sink=writer)
    for record in list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))[:300]:
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    return url


@pytest.fixture(scope="module")
def app(store_url: str) -> FastAPI:
    settings = ApiSettings(api_token="t0ken", replica_urls={"lab": "http://127.0.0.1:9"})
    return create_app(ApiData(engine=open_store(store_url)), settings)


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def error_of(response: Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert body["error"]["status"] == status
    return dict(body["error"])


# --- the body limit ---------------------------------------------------------------------------
def drive(
    app: FastAPI, headers: list[tuple[bytes, bytes]], chunks: Iterator[bytes]
) -> tuple[int, dict[str, Any], int]:
    """POST /lookup straight through the ASGI app: (status, JSON answer, body bytes it read)."""
    import anyio

    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/lookup",
        "raw_path": b"/lookup",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    anyio.run(app, scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), read


def long_token_list(chunk_bytes: int) -> Iterator[bytes]:
    """A JSON token list four times the limit, `chunk_bytes` at a time (bounded: an API that
    read it all must still end)."""
    yield b'{"token_ids": ['
    for _ in range(4 * LIMIT // chunk_bytes):
        yield b"1," * (chunk_bytes // 2)
    yield b"1]}"


def test_a_chunked_body_stops_being_read_once_past_the_limit(app: FastAPI) -> None:
    chunk = 64 * 1024
    status, answer, read = drive(app, [(b"transfer-encoding", b"chunked")], long_token_list(chunk))
    assert status == 413 and answer["error"]["code"] == "too_large"
    assert LIMIT < read <= LIMIT + chunk + 16  # one message past the limit, not the whole body


def test_a_declared_length_over_the_limit_is_refused_before_reading(app: FastAPI) -> None:
    status, answer, read = drive(
        app, [(b"content-length", str(LIMIT + 1).encode())], long_token_list(1024)
    )
    assert (status, answer["error"]["code"], read) == (413, "too_large", 0)
    status, answer, read = drive(app, [(b"content-length", b"12x")], long_token_list(1024))
    assert (status, answer["error"]["code"], read) == (400, "bad_request", 0)


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))


def test_a_200_mb_chunked_body_does_not_grow_the_server(store_url: str, tmp_path: Path) -> None:
    """A real `kvscope api` process and a real chunked upload (httpx, a generator body): the
    server answers 413 and its peak memory does not follow the body."""
    port = free_port()
    log = tmp_path / "api.log"
    command = [
        sys.executable,
        "-m",
        "kvscope.cli",
        "api",
        "--store",
        store_url,
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # Warm the lookup path first: what it allocates once is not the body's doing.
        assert (
            httpx.post(url + "/lookup", json={"token_ids": [1, 2]}, timeout=30).status_code == 200
        )
        before = peak_rss_kib(proc.pid)
        chunk = b"1," * (512 * 1024)  # 1 MiB; 200 of them

        def body() -> Iterator[bytes]:
            yield b'{"token_ids": ['
            for _ in range(200):
                yield chunk
            yield b"1]}"

        try:
            json_type = {"content-type": "application/json"}
            response = httpx.post(url + "/lookup", content=body(), timeout=60, headers=json_type)
            error_of(response, 413)
        except httpx.TransportError:
            pass  # the server closed the connection under the upload: refused all the same
        grown_mib = (peak_rss_kib(proc.pid) - before) / 1024
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"peak RSS grew by {grown_mib:.1f} MiB for a 200 MiB chunked body")
    assert grown_mib < 3 * LIMIT / 2**20


# --- one error shape --------------------------------------------------------------------------
def test_405_says_what_is_allowed(client: TestClient) -> None:
    response = client.delete("/lookup")
    error_of(response, 405)
    assert response.headers["allow"] == "POST"
    assert client.post("/replicas").headers["allow"] == "GET"


def test_unknown_paths_and_bad_json_are_the_one_shape(client: TestClient) -> None:
    assert error_of(client.get("/nope"), 404)["code"] == "not_found"
    bad = client.post("/lookup", content=b"{not json", headers={"content-type": "application/json"})
    assert error_of(bad, 422)["code"] == "invalid"


class Broken(ApiData):
    """An ApiData with a bug: reading the streams raises an error whose text holds SQL."""

    def streams(self) -> list[StreamId]:
        raise RuntimeError("SELECT secret FROM streams WHERE password = 'hunter2'")


def test_an_unexpected_error_is_a_500_that_tells_nothing_and_is_logged_once(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(Broken(engine=open_store(store_url)))
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.WARNING):
        answers = [client.get("/replicas") for _ in range(3)]
    for response in answers:
        error = error_of(response, 500)
        assert error["code"] == "internal"
        assert "SELECT" not in response.text and "hunter2" not in response.text
        assert "Traceback" not in response.text and "RuntimeError" not in response.text
    logged = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert len(logged) == 1  # rate-limited: three errors, one line (with the traceback)
    assert "RuntimeError" in logged[0].getMessage()


# --- /lookup ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "token_ids",
    [["1"], [True], [False], [1.0], [1.5], [-1], [2**32], [None], "12", 7, [[1]]],
    ids=repr,
)
def test_token_ids_are_strict_non_negative_ints(client: TestClient, token_ids: object) -> None:
    error = error_of(client.post("/lookup", json={"token_ids": token_ids}), 422)
    assert error["code"] == "invalid" and error["field"].startswith("token_ids")


def test_valid_token_ids_and_the_length_bound(client: TestClient) -> None:
    answer = client.post("/lookup", json={"token_ids": [0, 2**32 - 1, 5]})
    assert answer.status_code == 200 and set(answer.json()) >= {"matches", "best"}
    too_long = client.post("/lookup", json={"token_ids": [1] * 1_000_001})
    assert error_of(too_long, 422)["field"] == "token_ids"


# --- the bearer token -------------------------------------------------------------------------
def test_the_token_is_compared_in_constant_time(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return compare(a, b)

    monkeypatch.setattr("kvscope.api.routes_resets.hmac.compare_digest", spy)

    def reset(authorization: bytes) -> Response:
        return client.post("/replicas/lab/reset", headers=[(b"authorization", authorization)])

    assert error_of(reset(b"Bearer wrong"), 401)["code"] == "unauthorized"
    assert error_of(reset(b"Bearer t0ken-and-more"), 401)["code"] == "unauthorized"
    assert error_of(reset(b"Basic t0ken"), 401)["code"] == "unauthorized"
    assert error_of(reset(b"Bearer"), 401)["code"] == "unauthorized"
    assert error_of(reset("Bearer tök€n".encode()), 401)["code"] == "unauthorized"
    accepted = reset(b"Bearer t0ken")  # the replica's URL is a closed port: asked, unreachable
    assert accepted.status_code == 200 and accepted.json()["outcome"] == "unreachable"
    assert len(compared) == 6 and compared[-1] == (b"t0ken", b"t0ken")


def test_settings_refuse_an_empty_token() -> None:
    # "Authorization: Bearer" would otherwise match it.
    for token in ("", "  "):
        with pytest.raises(ValueError, match="empty"):
            ApiSettings(api_token=token)


@pytest.mark.parametrize("command", ["api", "serve"])
@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("token", ["", "   ", "\t"])
def test_an_empty_token_is_refused_at_start(command: str, how: str, token: str) -> None:
    # Were the token not checked first, both would stop on their next argument (exit 1 or 2,
    # with another message), not start serving.
    missing = "/nonexistent/kvscope"
    args = [command, "--config", missing + ".toml"]
    if command == "api":
        args = [command, "--store", f"sqlite:///{missing}.sqlite"]
    env = {"KVSCOPE_API_TOKEN": token} if how == "env" else {}
    if how == "flag":
        args += ["--api-token", token]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "empty" in lines[0] and "api-token" in lines[0].lower(), lines
