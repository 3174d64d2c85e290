"""Alembic migrations of the kvscope store."""
