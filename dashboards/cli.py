"""`kvscope dashboards push | export`: the Grafana dashboards, into a Grafana or into files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvscope.dashboards.generate import DEFAULT_FOLDER, export

dashboards_app = typer.Typer(
    name="dashboards",
    help="Grafana dashboards: push them to a Grafana, or export JSON and provisioning files.",
    no_args_is_help=True,
    add_completion=False,
)

FolderOpt = Annotated[str, typer.Option("--folder", help="Grafana folder (created when missing).")]


@dashboards_app.command("push")
def push_command(
    grafana_url: Annotated[
        str,
        typer.Option(
            "--grafana-url",
            envvar="GRAFANA_URL",
            help="Grafana's base URL, e.g. http://grafana:3000",
        ),
    ],
    token: Annotated[
        str,
        typer.Option(
            "--token",
            envvar="GRAFANA_TOKEN",
            help="A service account token that may write dashboards and folders.",
        ),
    ],
    folder: FolderOpt = DEFAULT_FOLDER,
) -> None:
    """Create or update the dashboards (stable uids, overwrite): running it twice is safe."""
    from grafana_client.client import GrafanaException

    from kvscope.dashboards.push import push

    try:
        pushed = push(grafana_url, token, folder)
    except GrafanaException as exc:
        typer.echo(f"error: Grafana answered {exc.status_code}: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    except OSError as exc:  # niquests' connection errors are OSErrors
        typer.echo(f"error: cannot reach {grafana_url}: {exc}", err=True)
        raise typer.Exit(1) from exc
    state = "created" if pushed.folder_created else "found"
    typer.echo(f"folder {folder!r} ({pushed.folder_uid}) {state}")
    for uid, url in pushed.dashboards:
        typer.echo(f"saved {uid} {url}")


@dashboards_app.command("export")
def export_command(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="Folder to write (created when missing).")
    ],
    folder: FolderOpt = DEFAULT_FOLDER,
    grafana_path: Annotated[
        str | None,
        typer.Option(
            "--grafana-path", help="Where Grafana sees DIRECTORY (default: its absolute path here)."
        ),
    ] = None,
) -> None:
    """Write the dashboards' JSON and a provisioning file (apiVersion 1, a file provider)."""
    for path in export(directory, folder, grafana_path):
        typer.echo(f"wrote {path}")
