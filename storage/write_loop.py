"""The store's writer thread: rows from the queue into the store, one transaction at a time.

A store that is down is waited out (retried with backoff, rows waiting in the queue and its
spill); a row the store refuses for good is found and left out, so that one bad row never
stops the writer nor costs the rows beside it. If the thread stops anyway, `failure` says why.
Work that no row waits for (compaction: storage/log_repack.py, then the pages it freed given
back: storage/free_pages.py) is done only while the writer would wait for rows anyway (none
queued, or lingering for more), in short transactions of its own: never while a whole take is
queued.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.types import StreamId
from kvscope.storage.autocommit import writing
from kvscope.storage.engine import store_down
from kvscope.storage.free_pages import FreePages
from kvscope.storage.heap_trim import rss_bytes, trim_heap
from kvscope.storage.prepared import Prepared
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.rows import Row, droppable
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer_state import WriterStats, rows_per_take

logger = logging.getLogger("kvscope.storage.writer")

WRITER_THREAD = "kvscope-store-writer"
"""The writer thread's name (benchmarks/store.py reads its times by it)."""


class WriteLoop:
    def __init__(
        self,
        engine: Engine,
        queue: RowQueue[Row],
        sql: RowWriter,
        settings: StoreSettings,
        stats: WriterStats,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.sql = sql
        self.settings = settings
        self.stats = stats
        self.failure: str | None = None
        self._refusals = RateLimitedLog(logger)
        self._held_peak = 0
        """The most bytes held in memory since the heap was last trimmed."""
        self._leaving: list[tuple[int, StreamId]] = []
        """Streams to forget once the queue's rows up to each mark are written."""
        self._leaving_lock = threading.Lock()
        self._idle_failed = False
        """The last idle step failed: none until a transaction of rows is written."""
        self.free_pages = FreePages()
        self._cpu_started = 0.0
        """The writer thread's CPU clock when it started."""
        self.thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self._cpu_started = time.thread_time()
        try:
            while (rows := self.queue.take(self._rows_per_take(), self._idle_step)) is not None:
                # Before `done`: what was just taken still counts as held.
                self._held_peak = max(self._held_peak, self.queue.memory_bytes)
                # A stream forgotten while the writer was idle (its rows all written) and
                # taken back since: its state goes before its new rows, not after them.
                self._forget_left()
                started = time.perf_counter()
                droppable = self._write_rows(rows)
                self.stats.write_seconds_total += time.perf_counter() - started
                self.stats.rows_written += len(rows)
                self.stats.transactions += 1
                self.stats.writer_cpu_seconds_total = time.thread_time() - self._cpu_started
                self.queue.done(droppable)
                # Not held while the next take waits (a take's payloads, up to
                # `rows_per_transaction` of them), nor through a trim.
                del rows
                self._forget_left()
                self._trim_after_backlog()
        except Exception as exc:  # said, not hidden: see `failure`
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.exception("the store writer stopped: %s", self.failure)

    @property
    def idle_work(self) -> bool:
        """Whether work is left for when no row waits (re-packing, then free pages given
        back): read from any thread."""
        return not self._idle_failed and self._idle_left

    @property
    def idle_put_off(self) -> bool:
        """Whether work is left for when no row waits that a failed step put off until the
        next transaction of rows: read from any thread."""
        return self._idle_failed and self._idle_left

    @property
    def _idle_left(self) -> bool:
        return self.sql.idle_work or self.free_pages.pending

    def _idle_step(self) -> bool:
        """While the queue's take waits for rows: a step of the work no row waits for; whether
        it did one. One that fails is rolled back, and done again after the next transaction
        of rows."""
        if self._idle_failed:
            return False
        repack = self.sql.idle_work
        if not repack and not self.free_pages.pending:
            return False
        self._forget_left()
        cpu = time.thread_time()
        taken = pages = 0
        try:
            with self.engine.begin() as conn:
                if repack:
                    taken = self.sql.idle_step(conn)
                else:
                    pages = self.free_pages.step(conn)
        except Exception as exc:
            if repack:
                self.sql.idle_ended(committed=False)
            self._idle_failed = True
            self._refusals.warning(
                f"idle:{type(exc).__name__}",
                "the writer's idle work failed (%s: %s); tried again later",
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            return False
        if repack:
            # Before the step ends: `idle_work` (read from other threads) never reads False
            # with pages still to give back.
            if taken:
                self.free_pages.freed()  # the old, larger chunks' pages
            self.sql.idle_ended(committed=True)
        self.stats.idle_steps += 1
        self.stats.idle_chunks += taken
        self.stats.idle_pages += pages
        now = time.thread_time()
        self.stats.idle_cpu_seconds_total += now - cpu
        self.stats.writer_cpu_seconds_total = now - self._cpu_started
        return True

    def _rows_per_take(self) -> int:
        return rows_per_take(self.settings, self.sql.streams_written)

    def forget(self, stream: StreamId) -> None:
        """Any thread: `stream` is written no more here; once the rows queued until now are
        written (they may still follow its reset), its state on the writer thread goes."""
        with self._leaving_lock:
            self._leaving.append((self.queue.put_total, stream))

    def _forget_left(self) -> None:
        if not self._leaving:
            return
        written = self.queue.written_total
        with self._leaving_lock:
            due = [stream for mark, stream in self._leaving if mark <= written]
            self._leaving = [(mark, s) for mark, s in self._leaving if mark > written]
        for stream in due:
            self.sql.forget_stream(stream)

    def _trim_after_backlog(self) -> None:
        """A backlog past `trim_after_bytes` has drained (to a sixteenth of it, since rows
        keep coming): hand the heap it used back to the OS, once per backlog."""
        limit = self.settings.trim_after_bytes
        if self._held_peak < limit or self.queue.memory_bytes > limit // 16:
            return
        if self.queue.spill_active:
            return
        before = rss_bytes()
        self._held_peak = 0
        if not trim_heap():
            return
        self.stats.heap_trims += 1
        after = rss_bytes()
        if before is not None and after is not None:
            logger.info(
                "store backlog drained; heap handed back: RSS %.0f -> %.0f MiB",
                before / 2**20,
                after / 2**20,
            )

    def _write_rows(self, rows: list[Row]) -> int:
        """Write `rows` in one transaction, waiting out a store that is down; the number of
        droppable rows among them. Rows the store refuses for good (a value it cannot hold, a
        bug) are found one by one and left out, counted and logged: one bad row never stops
        the writer, nor costs the rows beside it."""
        try:
            prepared = self.sql.prepare(rows)
            self._commit(prepared)
            self.sql.committed(prepared)
            return prepared.droppable
        except Exception as exc:
            if len(rows) > 1:
                # What the rolled-back transaction recorded (ids, re-packs, fed followers)
                # is not in the store: the rows written again must not count on it.
                self.sql.forget_ids()
                return sum(self._write_rows([row]) for row in rows)
            self._row_refused(rows[0], exc)
            return int(droppable(rows[0]))

    def _commit(self, prepared: Prepared) -> None:
        backoff = self.settings.retry_initial_s
        while True:
            try:
                one = self.sql.one_statement(prepared, self.engine.dialect.name)
                with writing(self.engine, one) as conn:
                    self.sql.write(conn, prepared)
                self._idle_failed = False
                return
            except SQLAlchemyError as exc:
                if not store_down(exc):
                    raise
                self.stats.retries += 1
                self.stats.last_error = str(exc).splitlines()[0]
                logger.warning(
                    "store write failed (%s); retrying in %.1fs", self.stats.last_error, backoff
                )
                self.sql.forget_ids()
                time.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_max_s)

    def _row_refused(self, row: Row, exc: Exception) -> None:
        self.sql.forget_ids()
        self.stats.rows_refused += 1
        what = type(row).__name__
        if type(row) is tuple:
            what = f"batch {row[2]} of {row[0]}"
        self._refusals.warning(
            f"refused:{type(exc).__name__}",
            "the store refused a row (%s: %s: %s); it is left out",
            what,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            exc_info=exc,
        )
