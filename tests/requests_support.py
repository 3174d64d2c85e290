"""The requests through kvscope that caused the bundled capture's resets, as the API records
them (POST /replicas/{replica}/reset): for the tests that read `reset_requests` (the
dashboards, the page, the report)."""

from __future__ import annotations

import json

from sqlalchemy import Engine, insert

from kvscope.demo_sources import bundled
from kvscope.storage import schema
from tests.conftest import collector_time


def insert_requests(engine: Engine, replica: str = "lab", detail: bool = True) -> None:
    """At their time in the recording (lab_3rps_180s): vLLM refused the first (requests were
    running), the preempt and keep-running ones succeeded. `detail`: vLLM's answer as the
    API keeps it; else none."""
    sidecar = json.loads(bundled("lab_3rps_180s.json").read_text())
    with engine.begin() as conn:
        for reset in sidecar["resets"]:
            conn.execute(
                insert(schema.reset_requests).values(
                    replica=replica,
                    requested_at=collector_time(conn, reset["ts"]),
                    requested_by="token@127.0.0.1",
                    mode=reset["mode"],
                    external=False,
                    outcome="success" if reset["result"] else "refused",
                    http_status=200,
                    detail=json.dumps({"success": reset["result"]}) if detail else None,
                )
            )
