from kvscope.collector._map_counters import MapCounters
from kvscope.collector.block_table import BlockTable
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import TableKey

class MapCore:
    """`tables` (by `TableKey`), `counters` (its `MapCounters`) and `limits` (`IngestLimits`)."""

    tables: dict[TableKey, BlockTable]
    counters: MapCounters
    limits: IngestLimits
    def _forget_cached_table(self) -> None: ...
