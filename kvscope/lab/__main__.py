"""`python -m kvscope.lab ...`: the lab command on its own (same options as `kvscope lab`)."""

from __future__ import annotations

import typer

from kvscope.lab.cli import lab

app = typer.Typer(add_completion=False, rich_markup_mode=None)  # as `kvscope lab`
app.command()(lab)

if __name__ == "__main__":
    app()
