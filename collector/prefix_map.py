"""One publisher's prefix-cache map: its tables per (medium, group), and how events change them.

`PrefixMap.apply` is the only writer. Before the map is emptied (`AllBlocksCleared`, or a
publisher restart) the full map is handed to its `on_clear` (the stream's ingest, which tells
its sink): that is the "before" of a reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from kvscope.collector._map_apply import apply_batch
from kvscope.collector._map_core import MapCore
from kvscope.collector._map_counters import MapCounters
from kvscope.collector.block_table import BlockTable, TableStats
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.sink import ClearedMap, ClearReason
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.types import StreamId, TableKey

TableChanges = dict[TableKey, list[int]]
"""Blocks stored and removed per table, `[stored, removed]`."""


class PrefixMatch(NamedTuple):
    """A lookup's answer for one table. A tuple: the API makes one per table of every replica
    per request, and a frozen dataclass cost three times as much to build."""

    table: TableKey
    blocks: int
    tokens: int


class PrefixMap(MapCore):
    """The cached blocks of one publisher (one replica's data-parallel rank). Its `tables`,
    `counters` and `limits` are `MapCore`'s C fields, read in C for each batch."""

    def __init__(
        self, stream: StreamId, on_clear: Callable[[ClearedMap], None] | None = None
    ) -> None:
        self.stream = stream
        self.on_clear = on_clear
        """Handed the map before each clear empties it."""
        self.tables: dict[TableKey, BlockTable] = {}
        self.counters = MapCounters()
        self.limits: IngestLimits = DEFAULT_LIMITS

    @property
    def signed_hashes(self) -> bool:
        return self.counters.signed_hashes

    # --- writes -------------------------------------------------------------------------------
    apply = apply_batch
    """`apply(batch, epoch=0, degraded=False, recv_ts=None) -> TableChanges`: apply one batch;
    `epoch` and `degraded` go to `on_clear` with a clear. Returns the blocks it stored and
    removed per table.

    A batch that would take the map past its `limits` raises MalformedPayload
    (LIMIT_EXCEEDED) before it changes anything. Compiled (collector/_map_apply.pyx): every live
    batch comes through it."""

    def clear(
        self,
        reason: ClearReason,
        seq: int,
        ts: float,
        epoch: int,
        degraded: bool,
        recv_ts: float | None = None,
    ) -> ClearedMap:
        """Empty every tier and group, handing what was there to `on_clear` first."""
        cleared = ClearedMap(
            self.stream,
            epoch,
            reason,
            seq,
            ts,
            self.tables,
            degraded,
            recv_ts,
            self.counters.signed_hashes,
        )
        self.tables = {}
        self._forget_cached_table()
        self.counters.clears += 1
        if self.on_clear is not None:
            self.on_clear(cleared)
        return cleared

    # --- reads --------------------------------------------------------------------------------
    def stats(self) -> dict[TableKey, TableStats]:
        return {key: table.stats() for key, table in self.tables.items()}

    def totals(self) -> TableStats:
        blocks = copies = hittable = orphans = 0
        for table in self.tables.values():
            blocks += len(table)
            copies += table.copies
            hittable += table.hittable_count
            orphans += table.orphan_count
        return TableStats(blocks, copies, hittable, orphans)

    def counts(self) -> dict[tuple[int, int], int]:
        """(hash, group) -> copies for the GPU tier: the shape of vLLM's BlockPool map."""
        return {
            (block_hash, key.group): n
            for key, table in self.tables.items()
            if key.medium == "GPU"
            for block_hash, n in table.counts().items()
        }

    def longest_prefix(
        self, token_ids: Iterable[int] | TokenQuery, lora_name: str | None = None
    ) -> list[PrefixMatch]:
        """Per table, the longest cached prefix of `token_ids` reachable from block 0."""
        query = token_ids if isinstance(token_ids, TokenQuery) else TokenQuery(token_ids)
        tables = self.tables
        matches = []
        # Most maps have one table: sort only when there are more.
        for key in tables if len(tables) < 2 else sorted(tables, key=_medium_group):
            table = tables[key]
            blocks = table.longest_prefix(query, lora_name)
            matches.append(PrefixMatch(key, blocks, blocks * table.block_size))
        return matches


def _medium_group(key: TableKey) -> tuple[str, int]:
    return key.medium, key.group
