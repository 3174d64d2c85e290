from kvscope.collector.prefix_map import PrefixMap, TableChanges
from kvscope.collector.types import Batch

def apply_batch(
    prefix_map: PrefixMap,
    batch: Batch,
    epoch: int = 0,
    degraded: bool = False,
    recv_ts: float | None = None,
) -> TableChanges:
    """`PrefixMap.apply(batch, epoch, degraded, recv_ts)`."""
