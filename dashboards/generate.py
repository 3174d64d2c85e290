"""The dashboards as JSON files, and Grafana's provisioning file for them.

`python -m kvscope.dashboards.generate` rewrites the committed `dashboards/json/*.json`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvscope.dashboards import collector_health, fleet, reset_explorer
from kvscope.dashboards.model import Json

BUILDERS: tuple[Callable[[], Json], ...] = (
    fleet.build,
    reset_explorer.build,
    collector_health.build,
)
JSON_DIR = Path(__file__).resolve().parent / "json"
"""Where the generated files are committed."""
PROVISIONING_FILE = "kvscope-dashboards.yaml"
DEFAULT_FOLDER = "kvscope"


def build_all() -> list[Json]:
    dashboards = [build() for build in BUILDERS]
    uids = [d["uid"] for d in dashboards]
    assert len(set(uids)) == len(uids), uids
    return dashboards


def render(dashboard: Json) -> str:
    """The file's text: stable (key order as built), indented, one trailing newline."""
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def file_name(dashboard: Json) -> str:
    return f"{dashboard['uid']}.json"


def rendered() -> dict[str, str]:
    """file name -> text, for every dashboard."""
    return {file_name(d): render(d) for d in build_all()}


def write_json(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def folder_uid(folder: str) -> str:
    """A stable folder uid from its name (Grafana allows 40 characters: letters, digits, -_)."""
    slug = re.sub(r"[^a-z0-9]+", "-", folder.lower()).strip("-")[:40].strip("-")
    return slug or DEFAULT_FOLDER


def provisioning_yaml(path: str, folder: str = DEFAULT_FOLDER) -> str:
    """A file provider for Grafana's provisioning/dashboards/: it loads every JSON in `path`.

    Strings are written as JSON strings, which YAML reads as double-quoted scalars."""
    q = json.dumps
    return (
        "# kvscope's dashboards for Grafana's file provisioning: put this file in Grafana's\n"
        "# provisioning/dashboards/ folder; options.path is where Grafana reads the JSON files.\n"
        "apiVersion: 1\n"
        "providers:\n"
        f"  - name: {q('kvscope')}\n"
        "    orgId: 1\n"
        f"    folder: {q(folder)}\n"
        f"    folderUid: {q(folder_uid(folder))}\n"
        "    type: file\n"
        "    disableDeletion: false\n"
        "    allowUiUpdates: false\n"
        "    updateIntervalSeconds: 60\n"
        "    options:\n"
        f"      path: {q(path)}\n"
        "      foldersFromFilesStructure: false\n"
    )


def export(
    directory: Path, folder: str = DEFAULT_FOLDER, grafana_path: str | None = None
) -> list[Path]:
    """The JSON files and the provisioning file, in `directory`. `grafana_path` is where
    Grafana will see that folder (a container mount, say); by default, the folder itself."""
    written = write_json(directory)
    path = grafana_path or str(directory.resolve())
    provisioning = directory / PROVISIONING_FILE
    provisioning.write_text(provisioning_yaml(path, folder), encoding="utf-8")
    return [*written, provisioning]


def main() -> None:
    for path in write_json(JSON_DIR):
        sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
