from kvscope.collector.types import Batch

def decode_map_batch(payload: bytes, seq: int) -> Batch | None:
    """The Batch of a vLLM >= 0.24 map-layout payload, or None: decode it the slow way."""
