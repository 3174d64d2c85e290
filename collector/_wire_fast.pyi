from kvscope.collector.types import Batch, TableKey

def decode_map_batch(payload: bytes, seq: int, max_block_size: int) -> Batch | None:
    """The Batch of a vLLM >= 0.24 map-layout payload, or None: decode it the slow way.
    `max_block_size`: `IngestLimits.max_block_size`."""

def _keys_both_ways(
    payloads: list[bytes],
) -> list[tuple[TableKey | None, TableKey | None, bool]]:
    """For tests: each event's table key, as `_LastKey.of` finds it and as `key_of` alone does,
    and whether `of` matched the bytes."""
