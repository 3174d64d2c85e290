"""A SQLite store's free pages handed back to the file system, a step at a time, while the
writer idles (storage/write_loop.py).

Chunks re-packed smaller (storage/log_repack.py) and rows pruned by retention leave pages free
inside the file. Inserts reuse them, but a file never shrinks by itself: a store made with
`auto_vacuum=INCREMENTAL` (storage/engine.py does so for a new file) moves its last pages into
the free ones and truncates, `PAGES_PER_STEP` at a time, so that a step is a short transaction
that rows arriving meanwhile wait out. A store made before has no way to (only a whole VACUUM
could): it is left as it is. PostgreSQL's own vacuum looks after its free space.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

INCREMENTAL = 2
"""`PRAGMA auto_vacuum`'s value for a file that can give back free pages on request."""


class FreePages:
    """The writer thread's: whether pages may be free to give back, and the steps that do."""

    KEPT = 256
    """Free pages left in the file: room for the next inserts, not worth moving pages for."""
    PAGES_PER_STEP = 2048
    """Pages given back per step at most."""
    CHECK_EVERY_S = 300.0
    """How often an idle writer looks for free pages nobody said were freed (retention prunes
    on a thread of its own)."""

    def __init__(
        self,
        kept: int = KEPT,
        per_step: int = PAGES_PER_STEP,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.kept = kept
        self.per_step = per_step
        self.check_every_s = check_every_s
        self._marked = False
        self._next_check = time.monotonic() + check_every_s
        self._able: bool | None = None
        """Whether the store can give pages back (None: not looked at yet)."""

    def freed(self) -> None:
        """Work that may have freed pages was committed."""
        self._marked = self._able is not False

    @property
    def pending(self) -> bool:
        """Whether a step may have pages to give back."""
        if self._able is False:
            return False
        return self._marked or time.monotonic() >= self._next_check

    def step(self, conn: sa.Connection) -> int:
        """Within a transaction of its own: give back up to `per_step` free pages past the
        `kept` ones; how many."""
        if self._able is None:
            self._able = (
                conn.dialect.name == "sqlite"
                and conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one() == INCREMENTAL
            )
        if not self._able:
            self._marked = False
            return 0
        driver = conn.connection.dbapi_connection
        assert driver is not None
        if not driver.in_transaction:  # the driver begins one only before DML, not a pragma
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
        given = min(free - self.kept, self.per_step)
        if given <= 0:
            self._marked = False
            self._next_check = time.monotonic() + self.check_every_s
            return 0
        self._give_back(conn, given)
        given = free - int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
        if given == 0:  # none would go: not again until the next check (no idle spinning)
            self._marked = False
            self._next_check = time.monotonic() + self.check_every_s
        return given

    def _give_back(self, conn: sa.Connection, pages: int) -> None:
        # A page per execution: the pragma frees one per result row it steps through, and
        # the driver steps once (it sees no columns, so it reads no further rows).
        cursor = conn.connection.cursor()
        try:
            for _ in range(pages):
                cursor.execute("PRAGMA incremental_vacuum(1)")
        finally:
            cursor.close()
