"""Alembic environment: run with the connection kvscope hands over (see storage/engine.py)."""

from __future__ import annotations

from alembic import context

from kvscope.storage.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `kvscope db upgrade` (it passes the connection)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
