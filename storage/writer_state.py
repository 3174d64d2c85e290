"""What the store's writer (storage/writer.py) keeps per stream, and the counts it reports."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.storage._store_sink import StreamState
from kvscope.storage.store_settings import StoreSettings

__all__ = ["StreamState", "WriterStats", "rows_per_take"]


@dataclass
class WriterStats:
    rows_written: int = 0
    transactions: int = 0
    batches_dropped: int = 0
    retries: int = 0
    rows_refused: int = 0
    """Rows the store refused for good (left out, logged): a hole, said in the metrics."""
    last_error: str | None = None
    write_seconds_total: float = 0.0
    """Wall seconds in the writer's transactions (retries and their waits included)."""
    writer_cpu_seconds_total: float = 0.0
    """The writer thread's CPU seconds since it started, as of its last transaction (of rows or
    of idle work): beside `write_seconds_total`, whether it waited (on the GIL, the store) or
    worked."""
    idle_steps: int = 0
    """Transactions of idle work (log_repack.py's steps), done while the writer waited for
    rows."""
    idle_chunks: int = 0
    """Chunks stored before their stream's dictionary, re-packed in idle time."""
    idle_pages: int = 0
    """Free pages given back to the file system in idle time (storage/free_pages.py)."""
    idle_cpu_seconds_total: float = 0.0
    """Of `writer_cpu_seconds_total`, the idle work's."""
    heap_trims: int = 0
    """Times a drained backlog's freed heap was handed back to the OS."""


def rows_per_take(settings: StoreSettings, streams: int) -> int:
    """The most rows one transaction takes: `rows_per_transaction` for each of the `streams` the
    last one wrote, up to half the queue's bound (so that the queue, which fills on while the
    writer lingers, never reaches it for want of a take). Shared by all, a fleet's streams got a
    sliver of it each: chunks of a few batches, each a zstd call and a column split, which
    packed worse and cost the writer more than the rest of its work."""
    base = settings.rows_per_transaction
    return max(base, min(base * streams, settings.queue_rows // 2))
