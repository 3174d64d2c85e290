"""No password of a store URL, replica API URL or metrics URL is logged, printed or served.

`redact` masks it as SQLAlchemy's `render_as_string(hide_password=True)` does; the commands and
the API use it wherever a URL leaves the process. The stores are real (SQLite, and the shared
PostgreSQL with trust auth, which takes any password); ports nothing listens on stand for
unreachable servers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.engine import URL
from typer.testing import CliRunner

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.cli import app as cli
from kvscope.lab.ports import free_port
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.redact import has_userinfo, redact
from kvscope.storage.scrape import ScrapeError, fetch_metrics

SECRET = "hunter2"
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
"""Any user and password: SQLAlchemy writes them percent-encoded, but for spaces and '+'."""


@given(user=names, password=names.filter(bool), host=st.sampled_from(["db", "10.0.0.5"]))
def test_store_urls_are_masked_as_sqlalchemy_masks_them(
    user: str, password: str, host: str
) -> None:
    url = URL.create("postgresql+psycopg", user, password, host, 5432, "kvscope")
    shown = url.render_as_string(hide_password=False)
    assert redact(shown) == url.render_as_string(hide_password=True)
    assert redact(f"cannot open store {shown}: refused") == (
        f"cannot open store {url.render_as_string(hide_password=True)}: refused"
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://u:p%40ss@10.0.0.5:8000/x", "http://u:***@10.0.0.5:8000/x"),
        ("a http://u:pw@h:1 and https://v:pw2@g/m", "a http://u:***@h:1 and https://v:***@g/m"),
        ("@tcp://u:pw@0.0.0.0:5557", "@tcp://u:***@0.0.0.0:5557"),
        ("postgresql+psycopg://kvscope@db/kvscope", "postgresql+psycopg://kvscope@db/kvscope"),
        ("sqlite:////var/lib/kvscope/kvscope.sqlite", "sqlite:////var/lib/kvscope/kvscope.sqlite"),
        ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5557"),
        (
            "see http://host:80/x or mail me@example.com",
            "see http://host:80/x or mail me@example.com",
        ),
        ("postgresql://my user:pass word@db/x", "postgresql://my user:***@db/x"),
    ],
)
def test_redact_keeps_all_but_the_password(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_has_userinfo() -> None:
    assert has_userinfo("tcp://u:p@h:1") and has_userinfo("@tcp://u@h:1")
    assert not has_userinfo("tcp://h:1") and not has_userinfo("http://h:1/a@b")


def test_a_store_that_cannot_be_opened_is_named_without_its_password() -> None:
    url = f"postgresql+psycopg://kvscope:{SECRET}@127.0.0.1:{free_port()}/kvscope"
    for args in (
        ["api", "--store", url],
        ["db", "upgrade", "--store", url],
        ["collect", "--store", url, "--replica", "a=tcp://127.0.0.1:1", "--duration", "0"],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert SECRET not in result.output and "kvscope:***@127.0.0.1" in result.output, args


def test_endpoints_with_credentials_are_refused_without_printing_them() -> None:
    for replica in (f"a=tcp://u:{SECRET}@127.0.0.1:5557", f"a=http://u:{SECRET}@127.0.0.1:1"):
        result = CliRunner().invoke(cli, ["collect", "--replica", replica, "--duration", "0"])
        assert result.exit_code == 2, result.output
        assert SECRET not in result.output and "u:***@127.0.0.1" in result.output


def test_a_metrics_scrape_error_hides_the_password() -> None:
    with pytest.raises(ScrapeError) as raised:
        fetch_metrics(f"http://u:{SECRET}@127.0.0.1:{free_port()}/metrics", 2.0)
    assert SECRET not in str(raised.value) and "u:***@127.0.0.1" in str(raised.value)


def test_a_reset_detail_does_not_serve_the_replica_password(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    closed = f"http://vllm:{SECRET}@127.0.0.1:{free_port()}"
    settings = ApiSettings(api_token="t", replica_urls={"lab": closed})
    with TestClient(create_app(ApiData(engine=engine), settings)) as client:
        response = client.post("/replicas/lab/reset", headers={"authorization": "Bearer t"})
    assert response.json()["outcome"] == "unreachable"
    assert SECRET not in response.text and "vllm:***@127.0.0.1" in response.json()["detail"]
    with engine.connect() as conn:
        stored = conn.execute(select(schema.reset_requests.c.detail)).scalar_one()
    assert SECRET not in stored


def test_kvscope_api_logs_its_store_without_the_password(pg_url: str, tmp_path: Path) -> None:
    """The real PostgreSQL trusts local connections: any password opens it."""
    url = pg_url.replace("://postgres@", f"://postgres:{SECRET}@")
    port = free_port()
    log = tmp_path / "api.log"
    command = [sys.executable, "-m", "kvscope.cli", "api", "--store", url, "--port", str(port)]
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert SECRET not in text and "postgres:***@127.0.0.1" in text, text
