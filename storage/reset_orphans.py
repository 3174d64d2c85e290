"""The orphans of a reset's recovery, followed batch by batch (storage/reset_prefixes.py).

Two kinds, counted apart:

- *orphans the reset left*: blocks stored after the clear whose parent, named, was not cached
  (a keep-running reset: the running requests' blocks were cleared under them);
- *orphaned by eviction*: blocks stored after the clear under a cached parent (hittable, or on
  the way to it) whose parent was removed later while they stayed. The reset did not make them:
  the engine evicted a parent before its child.

Both are followed until they *rejoin* (the parent is cached again) or are removed first. The
map is seen between batches: a block stored under a parent that the same batch removes was
stored under a cached parent, so it is orphaned by eviction. A block is listed as orphaned by
eviction once, the first time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import KVEvent, TableKey
from kvscope.storage._frozen_new import frozen_new
from kvscope.storage._reset_orphans import add_chain, orphans_after
from kvscope.storage.reset_prefix_types import ResetOrphan

__all__ = ["Orphans", "add_chain"]

_ORPHAN_FIELDS = tuple(f.name for f in dataclasses.fields(ResetOrphan))


class Orphans:
    def __init__(self, root_before: Callable[[TableKey, int], int | None]) -> None:
        self.root_before = root_before
        """A block's group root in the before map (None: it was not cached then)."""
        self.found: list[list[Any]] = []
        """The reset's: [table, hash, parent, stored_ts, rejoined_ts, removed_ts, raw hash,
        raw parent]"""
        self.evicted: list[list[Any]] = []
        """Orphaned by eviction, the same fields with the time it was orphaned for stored_ts."""
        self._open: dict[tuple[TableKey, int], list[Any]] = {}
        """(table, hash) -> its entry, while it is followed (neither rejoined nor removed)."""
        self._open_under: dict[tuple[TableKey, int], set[int]] = {}
        """(table, parent) -> the hashes of the open entries that name it: a batch's events
        reach only the entries whose hash they remove or whose parent they store."""
        self._children: dict[TableKey, dict[int, int | set[int]]] = {}
        """parent -> the blocks stored under it since the clear: one as an int (most parents
        have one child, and a set per block stored was much of the cost), more as a set."""
        self._seen_evicted: set[tuple[TableKey, int]] = set()
        self.children = 0
        """About the blocks recorded in `_children`: each stored since the clear (those evicted
        under a parent that stays are kept too), so that a follower says what it holds."""
        self.changes = 0
        """Entries made or closed so far: the records an answer lists change with it only."""
        self._made: tuple[int, tuple[ResetOrphan, ...], tuple[ResetOrphan, ...]] | None = None
        """The last records made (`result`, `evicted_result`), as of `changes`."""

    def _entry(self, table: BlockTable, h: int, parent: int, ts: float) -> list[Any]:
        entry = [table.key, h, parent, ts, None, None, table.raw_hash(h), table.raw_parent(h)]
        self._open[table.key, h] = entry
        self._open_under.setdefault((table.key, parent), set()).add(h)
        self.changes += 1
        return entry

    def _close(self, entry: list[Any]) -> None:
        key, h, parent = entry[0], entry[1], entry[2]
        self.changes += 1
        del self._open[key, h]
        under = self._open_under[key, parent]
        under.discard(h)
        if not under:
            del self._open_under[key, parent]

    def start(self, view: PrefixMap, ts: float) -> None:
        """The map just after the clear's batch: what that batch stored under cleared parents."""
        for key in sorted(view.tables, key=lambda k: (k.medium, k.group)):
            table = view.tables[key]
            under = self._children.setdefault(key, {})
            for h in sorted(table.counts()):
                parent = table.parent_of(h)
                add_chain(under, parent, (h,))
                self.children += 1
                if parent is not None and parent not in table:
                    self.found.append(self._entry(table, h, parent, ts))

    def after(self, view: PrefixMap, events: Iterable[KVEvent], ts: float) -> None:
        """Called after each batch is applied to `view` (in Cython: storage/_reset_orphans.pyx,
        every batch a follower replays comes here)."""
        orphans_after(self, view, events, ts)

    def _rejoined_or_removed(
        self,
        view: PrefixMap,
        removed: dict[TableKey, set[int]],
        stored: list[tuple[TableKey, list[int]]],
        cleared: bool,
        ts: float,
    ) -> None:
        """Closes the open entries whose block is gone or whose parent is cached again. Only a
        batch's removals and stores (`stored`: each store's table and hashes) change either (a
        clear: anything), so only the entries they name are looked at, not every open one at
        every batch."""
        if cleared:
            reached = list(self._open.values())
        else:
            reached = [
                entry
                for key, gone in removed.items()
                for h in gone
                if (entry := self._open.get((key, h))) is not None
            ]
            for key, hashes in stored:
                for parent in hashes:
                    for h in self._open_under.get((key, parent), ()):
                        reached.append(self._open[key, h])
        for entry in reached:
            if entry[4] is None and entry[5] is None:  # (else reached twice, closed already)
                self._settle(view, entry, ts)

    def _settle(self, view: PrefixMap, entry: list[Any], ts: float) -> None:
        """Closes `entry` if its block is gone (removed) or its parent is cached (rejoined)."""
        table = view.tables.get(entry[0])
        if table is None or entry[1] not in table:
            entry[5] = ts
        elif entry[2] in table:
            entry[4] = ts
        else:
            return
        self._close(entry)

    def _records(self, rows: list[list[Any]]) -> tuple[ResetOrphan, ...]:
        # `ResetOrphan(...)`, made in C (storage/_frozen_new.pyx): an answer lists every one.
        return tuple(
            frozen_new(
                ResetOrphan,
                _ORPHAN_FIELDS,
                (*row, self.root_before(row[0], row[2])),
            )
            for row in rows
        )

    def _made_now(self) -> tuple[int, tuple[ResetOrphan, ...], tuple[ResetOrphan, ...]]:
        """The records as of now: made again only once an entry was made or closed since (an
        answer is made at every offset reached, and most pass with no orphan's news)."""
        made = self._made
        if made is None or made[0] != self.changes:
            made = self._made = (
                self.changes,
                self._records(self.found),
                self._records(self.evicted),
            )
        return made

    def result(self) -> tuple[ResetOrphan, ...]:
        return self._made_now()[1]

    def evicted_result(self) -> tuple[ResetOrphan, ...]:
        return self._made_now()[2]
