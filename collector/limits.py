"""What one publisher can make the collector hold: every size it controls has a limit here.

A batch that would take a stream past a limit is refused whole (`MalformedPayload`, kind
`limit_exceeded`, the limit named in the detail) before it changes anything: the map is then
incomplete, as for any refused batch, and says so. The defaults sit far above what a real vLLM
publisher reaches (the figures below), so that only a broken or hostile one meets them, and they
bound what such a publisher costs: about 16M blocks x ~135 B of map plus 2 GiB of tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from kvscope.collector.block_table import BlockTable, extras_bytes
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.types import AllCleared, Batch, BlocksStored, TableKey

MAX_COPIES_PER_BLOCK = 2**32 - 1
"""Fixed by the copy-count column (uint32): a block's count stops there, and stores past it are
counted (`BlockTable.saturated_stores`). Copies cost no memory, so this is no setting: a lower
limit would only make counts wrong sooner. Four billion copies of one hash take vLLM's
`kv_cache_report_mode="full"` (a store per prefix hit) weeks at a thousand hits a second."""


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """The limits of one stream (a replica's data-parallel rank); the collector passes one
    down to each stream's decoder and map."""

    max_block_size: int = 16_384
    """Tokens per block a BlockStored may declare (checked by the wire decoder). vLLM's default
    is 16; hybrid attention/Mamba models raise the attention block until a page holds a Mamba
    state (vLLM logs show 480 to 2,048 tokens). Memory follows the tokens stored, not this."""
    max_tables_per_stream: int = 64
    """(medium, group) tables: vLLM has three tiers (GPU, CPU, STORAGE; connectors name a few
    more) times its KV cache groups (one, or a handful for hybrid models)."""
    max_blocks_per_stream: int = 1 << 24
    """Cached blocks (distinct hashes) over all tables. A GPU tier holds 10^4 to 10^6 blocks
    (an 8 x 141 GB node with a 0.5B model: ~6M blocks of 16 tokens); CPU offload tiers a few
    million. 16M blocks cost ~2.2 GB of map."""
    max_token_bytes_per_stream: int = 1 << 31
    """Bytes of block contents held over all tables: token ids (4 bytes each) and the LoRA names
    and extra keys kept beside them. 2 GiB is 512M tokens, 5x the largest GPU tier above."""


DEFAULT_LIMITS = IngestLimits()


def admit(limits: IngestLimits, tables: Mapping[TableKey, BlockTable], batch: Batch) -> None:
    """Refuse `batch` (MalformedPayload, LIMIT_EXCEEDED) if applying it to a map of `tables`
    could take it past `limits`.

    Every block a BlockStored names is counted as new, and all its tokens, LoRA name and extra
    keys as kept: an upper bound that costs one pass over the events instead of a lookup per
    hash. Events after an AllBlocksCleared land in an emptied map and are counted from zero.
    """
    new_tables: set[TableKey] = set()
    blocks = content = 0
    for event in batch.events:
        if type(event) is AllCleared:
            _check(limits, tables, new_tables, blocks, content)
            tables, blocks, content = {}, 0, 0
            new_tables = set()
            continue
        if type(event) is BlocksStored:
            blocks += len(event.hashes)
            content += 4 * len(event.token_ids)
            if event.lora_name is not None or event.extra_keys is not None:
                content += sum(
                    extras_bytes(event.lora_name, extra)
                    for extra in event.extra_keys or [None] * len(event.hashes)
                )
        key = event.table  # type: ignore[union-attr]
        if key not in tables:
            new_tables.add(key)
    _check(limits, tables, new_tables, blocks, content)


def _check(
    limits: IngestLimits,
    tables: Mapping[TableKey, BlockTable],
    new_tables: set[TableKey],
    blocks: int,
    content: int,
) -> None:
    if new_tables and len(tables) + len(new_tables) > limits.max_tables_per_stream:
        _refuse("max_tables_per_stream", limits.max_tables_per_stream, len(tables), new_tables)
    if blocks:
        held = sum(len(table) for table in tables.values())
        if held + blocks > limits.max_blocks_per_stream:
            _refuse("max_blocks_per_stream", limits.max_blocks_per_stream, held, blocks)
    if content:
        held = sum(table.token_bytes() for table in tables.values())
        if held + content > limits.max_token_bytes_per_stream:
            _refuse("max_token_bytes_per_stream", limits.max_token_bytes_per_stream, held, content)


def _refuse(limit: str, value: int, held: int, adding: object) -> NoReturn:
    detail = f"{limit}={value}: the map holds {held}, the batch adds {adding!r:.80}"
    raise MalformedPayload(MalformedKind.LIMIT_EXCEEDED, detail)
