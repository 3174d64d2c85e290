"""`push` and `export`: no Grafana server can be installed here, so push talks to a stdlib HTTP
server that answers as Grafana's HTTP API does (folders, dashboards/db)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvscope.dashboards.cli import dashboards_app
from kvscope.dashboards.generate import PROVISIONING_FILE, rendered
from kvscope.dashboards.model import Json
from kvscope.dashboards.push import push
from kvscope.lab.ports import free_port
from tests.dashboards_support import DASHBOARDS, TOKEN


# --- push and export ----------------------------------------------------------------------------
class FakeGrafana:
    """Answers as Grafana's HTTP API does for what push uses; records every request."""

    def __init__(self, token: str = TOKEN) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.folders: dict[str, Json] = {}
        self.dashboards: dict[str, Json] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any) -> None:
                content = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                path = self.path.split("?")[0]
                fake.requests.append((method, path, body))
                if self.headers.get("authorization") != f"Bearer {token}":
                    self._answer(401, {"message": "Unauthorized"})
                    return
                self._answer(*fake.route(method, path, body))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) == ("GET", "/api/folders"):
            return 200, [
                {"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders.values()
            ]
        if (method, path) == ("POST", "/api/folders"):
            uid = body.get("uid") or uuid.uuid4().hex[:12]
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            if any(f["title"] == body["title"] for f in self.folders.values()):
                return 409, {"message": "a folder with the same name already exists"}
            self.folders[uid] = {
                "id": len(self.folders) + 1,
                "uid": uid,
                "title": body["title"],
                "url": f"/dashboards/f/{uid}/",
                "version": 1,
            }
            return 200, self.folders[uid]
        if (method, path) == ("POST", "/api/dashboards/db"):
            dashboard, uid = body["dashboard"], body["dashboard"].get("uid")
            if body.get("folderUid") not in self.folders:
                return 400, {"message": "folder not found"}
            old = self.dashboards.get(uid)
            if old is not None and not body.get("overwrite"):
                return 412, {"status": "name-exists", "message": "exists"}
            version = 1 if old is None else old["version"] + 1
            self.dashboards[uid] = {
                "dashboard": dashboard,
                "folderUid": body["folderUid"],
                "version": version,
            }
            slug = re.sub(r"[^a-z0-9]+", "-", dashboard["title"].lower()).strip("-")
            return 200, {
                "id": list(self.dashboards).index(uid) + 1,
                "uid": uid,
                "slug": slug,
                "status": "success",
                "url": f"/d/{uid}/{slug}",
                "version": version,
            }
        return 404, {"message": "Not found"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()
    yield fake
    fake.close()


def test_push_creates_the_folder_once_and_overwrites_by_uid(grafana: FakeGrafana) -> None:
    first = push(grafana.url, TOKEN, "kvscope")
    assert first.folder_created and first.folder_uid == "kvscope"
    uids = [d["uid"] for d in DASHBOARDS]
    assert [uid for uid, _ in first.dashboards] == uids
    requests_first = list(grafana.requests)
    assert [(m, p) for m, p, _ in requests_first] == [
        ("GET", "/api/folders"),
        ("POST", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(uids),
    ]
    saved = [body for _, p, body in requests_first if p == "/api/dashboards/db"]
    assert all(b["overwrite"] is True and b["folderUid"] == "kvscope" for b in saved)
    assert [b["dashboard"] for b in saved] == DASHBOARDS

    grafana.requests.clear()
    second = push(grafana.url, TOKEN, "kvscope")
    assert not second.folder_created and second.folder_uid == "kvscope"
    assert [(m, p) for m, p, _ in grafana.requests] == [
        ("GET", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(uids),
    ]
    assert [b for _, p, b in grafana.requests if p == "/api/dashboards/db"] == saved
    assert set(grafana.dashboards) == set(uids) and len(grafana.folders) == 1
    assert all(d["version"] == 2 for d in grafana.dashboards.values())


def test_push_uses_a_folder_of_that_title_made_by_hand(grafana: FakeGrafana) -> None:
    grafana.folders["abc123"] = {"id": 1, "uid": "abc123", "title": "LLM serving"}
    pushed = push(grafana.url, TOKEN, "LLM serving")
    assert pushed.folder_uid == "abc123" and not pushed.folder_created
    assert all(d["folderUid"] == "abc123" for d in grafana.dashboards.values())


def test_push_command(grafana: FakeGrafana) -> None:
    runner = CliRunner()
    args = ["push", "--grafana-url", grafana.url, "--folder", "Inference caches"]
    result = runner.invoke(dashboards_app, [*args, "--token", TOKEN])
    assert result.exit_code == 0, result.output
    assert "folder 'Inference caches' (inference-caches) created" in result.output
    assert result.output.count("saved kvscope-") == len(DASHBOARDS)
    result = runner.invoke(dashboards_app, args, env={"GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 0 and "found" in result.output, result.output
    refused = runner.invoke(dashboards_app, [*args, "--token", "wrong"])
    assert refused.exit_code == 1 and "401" in refused.output, refused.output
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = runner.invoke(dashboards_app, ["push", "--grafana-url", nobody, "--token", "t"])
    assert unreachable.exit_code == 1 and "cannot reach" in unreachable.output


def test_export_writes_the_json_and_a_provisioning_file(tmp_path: Path) -> None:
    out = tmp_path / "grafana" / "kvscope"
    result = CliRunner().invoke(dashboards_app, ["export", str(out), "--folder", "kvscope"])
    assert result.exit_code == 0, result.output
    for name, content in rendered().items():
        assert (out / name).read_text() == content
    provisioning = yaml.safe_load((out / PROVISIONING_FILE).read_text())
    assert provisioning["apiVersion"] == 1
    (provider,) = provisioning["providers"]
    assert provider["type"] == "file" and provider["folder"] == "kvscope"
    assert provider["options"]["path"] == str(out.resolve())
    result = CliRunner().invoke(
        dashboards_app, ["export", str(out), "--grafana-path", "/var/lib/grafana/dashboards/kv"]
    )
    provisioning = yaml.safe_load((out / PROVISIONING_FILE).read_text())
    assert provisioning["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/kv"
