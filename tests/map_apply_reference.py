"""`PrefixMap.apply` as it was written in Python, event by event: the reference the compiled
apply (collector/_map_apply.pyx) is held to by tests/test_map_apply.py."""

from __future__ import annotations

from kvscope.collector._admit import admit
from kvscope.collector.block_table import BlockTable
from kvscope.collector.prefix_map import PrefixMap, TableChanges
from kvscope.collector.sink import ClearReason
from kvscope.collector.types import AllCleared, Batch, BlocksStored, TableKey


def reference_apply(
    prefix_map: PrefixMap,
    batch: Batch,
    epoch: int = 0,
    degraded: bool = False,
    recv_ts: float | None = None,
) -> TableChanges:
    admit(prefix_map.limits, prefix_map.tables, batch)
    c = prefix_map.counters
    c.batches += 1
    ts = c.last_ts = batch.ts
    tables = prefix_map.tables
    changes: TableChanges = {}
    key: TableKey | None = None
    table: BlockTable | None = None
    counts: list[int] = []
    for event in batch.events:
        if type(event) is AllCleared:
            c.cleared_events += 1
            prefix_map.clear(
                ClearReason.ALL_BLOCKS_CLEARED, batch.seq, batch.ts, epoch, degraded, recv_ts
            )
            tables = prefix_map.tables
            key = table = None
            continue
        if event.table is not key:
            key = event.table
            table = tables.get(key)
            if table is None:
                table = tables[key] = BlockTable(key, ts)
            found = changes.get(key)
            if found is None:
                found = changes[key] = [0, 0]
            counts = found
        n = len(event.hashes)
        if type(event) is BlocksStored:
            table.store_chain(  # type: ignore[union-attr]
                event.hashes,
                event.parent,
                event.token_ids,
                event.block_size,
                ts,
                event.lora_name,
                event.extra_keys,
                event.raw_hashes,
                event.raw_parent,
            )
            if event.signed_hashes:
                c.signed_hashes = True
            c.stored_events += 1
            c.stored_blocks += n
            counts[0] += n
        else:
            table.remove(event.hashes)  # type: ignore[union-attr]
            c.removed_events += 1
            c.removed_blocks += n
            counts[1] += n
    return changes
