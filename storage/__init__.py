"""History of every replica's cache over time (SQLAlchemy; SQLite by default, PostgreSQL shared).

The single writer (`writer.py`) keeps every batch as received (`log_chunks.py`), checkpoints of
whole maps, every reset with its before and recovery, degraded and incomplete intervals and
per-second rollups; `history.py` rebuilds any past instant from a checkpoint plus the log.
"""
