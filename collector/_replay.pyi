from collections.abc import Iterable

from kvscope.collector.prefix_map import PrefixMap

def replay(prefix_map: PrefixMap, payloads: Iterable[tuple[int, bytes]], epoch: int) -> int:
    """Apply each (seq, payload) to `prefix_map` as
    `prefix_map.apply(BatchDecoder(prefix_map.limits).decode(payload, seq), epoch)` would;
    returns how many were applied."""
