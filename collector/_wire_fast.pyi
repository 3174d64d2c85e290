from kvscope.collector.types import Batch

def decode_map_batch(payload: bytes, seq: int, max_block_size: int) -> Batch | None:
    """The Batch of a vLLM >= 0.24 map-layout payload, or None: decode it the slow way.
    `max_block_size`: `IngestLimits.max_block_size`."""
