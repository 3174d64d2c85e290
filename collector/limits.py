"""What one publisher can make the collector hold: every size it controls has a limit here.

A batch that would take a stream past a limit is refused whole (`MalformedPayload`, kind
`limit_exceeded`, the limit named in the detail) before it changes anything: the block size by
the wire decoder (collector/wire_rules.py), the others by `PrefixMap.apply` (through
collector/_admit.pyx). The map is then incomplete, as for any refused batch, and says so. The
defaults sit far above what a real vLLM publisher reaches (the figures below), so that only a
broken or hostile one meets them, and they bound what such a publisher costs: about 16M blocks
x ~135 B of map plus 2 GiB of contents.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_COPIES_PER_BLOCK = 2**32 - 1
"""Fixed by the copy-count column (uint32): a block's count stops there, and stores past it are
counted (`BlockTable.saturated_stores`). Copies cost no memory, so this is no setting: a lower
limit would only make counts wrong sooner. Four billion copies of one hash take vLLM's
`kv_cache_report_mode="full"` (a store per prefix hit) weeks at a thousand hits a second."""

MAX_MESSAGE_BYTES_CEILING = 256 * 1024 * 1024
"""The most `--max-message-bytes` may allow: the store reads a chunk's frames back up to
`storage.log_columns.MAX_FRAME_BYTES`, and a batch's token planes take up to 4 bytes per byte
of its msgpack."""


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
    """Bytes of block contents held over all tables: token ids (4 bytes each) and the extra keys
    (multimodal identifiers, cache salts) kept beside them. 2 GiB is 512M tokens, 5x the largest
    GPU tier above."""


DEFAULT_LIMITS = IngestLimits()
