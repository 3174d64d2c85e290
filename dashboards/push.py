"""Create or update the dashboards in a Grafana through its HTTP API (grafana-client).

Idempotent: the folder is created only when no folder of that title exists, and each dashboard
is saved with its stable uid and `overwrite: true`, so a second push updates in place (Grafana
keeps the previous version in the dashboard's history).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grafana_client.api import GrafanaApi

from kvscope.dashboards.generate import DEFAULT_FOLDER, build_all, folder_uid
from kvscope.dashboards.model import Json


@dataclass(frozen=True)
class Pushed:
    folder_uid: str
    folder_created: bool
    dashboards: list[tuple[str, str]]
    """(uid, url) of each dashboard saved, as Grafana answered."""


def ensure_folder(api: Any, title: str) -> tuple[str, bool]:
    """The uid of the folder titled `title`, created (with a uid derived from it) if missing."""
    for folder in api.folder.get_all_folders():
        if folder.get("title") == title:
            return str(folder["uid"]), False
    created = api.folder.create_folder(title, uid=folder_uid(title))
    return str(created["uid"]), True


def push(
    grafana_url: str,
    token: str,
    folder: str = DEFAULT_FOLDER,
    timeout_s: float = 30.0,
    dashboards: list[Json] | None = None,
) -> Pushed:
    api: Any = GrafanaApi.from_url(grafana_url, credential=token, timeout=timeout_s)
    uid, created = ensure_folder(api, folder)
    saved = []
    for dashboard in dashboards if dashboards is not None else build_all():
        answer = api.dashboard.update_dashboard(
            {
                "dashboard": dashboard,
                "folderUid": uid,
                "overwrite": True,
                "message": f"kvscope dashboards push ({dashboard['uid']})",
            }
        )
        saved.append((str(answer.get("uid", dashboard["uid"])), str(answer.get("url", ""))))
    return Pushed(uid, created, saved)
