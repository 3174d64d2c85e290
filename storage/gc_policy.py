"""The store's GC policy: a higher young-generation threshold for the process while a writer runs.

CPython starts a young collection once tracked allocations outnumber deallocations by the
threshold (700). With the store on, each batch queues a row (a tuple: the cheapest object to
build on the ingest thread, storage/rows.py) that the writer thread frees only when it takes the
queue, up to `rows_per_transaction` at a time. So the ingest thread ran a young pass every ~700
batches, each walking those rows and the writer's lists of thousands of rows: ~80 passes per 1M
block-events, where memory-only ingest runs about none. Above the rows one transaction takes
(5,000), the writer's frees bring the count back down before it is reached.

Garbage cycles are still collected, only in larger steps: young garbage waits for at most
`threshold` allocations, and the older generations keep their thresholds (10, 10).
"""

from __future__ import annotations

import gc


def raise_young_threshold(threshold: int | None) -> None:
    """Set the young generation's threshold to `threshold` unless it is higher already (or
    `threshold` is None or 0, which would turn automatic collection off)."""
    current, middle, old = gc.get_threshold()
    if threshold and threshold > current:
        gc.set_threshold(threshold, middle, old)
