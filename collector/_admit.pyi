from kvscope.collector.block_table import BlockTable
from kvscope.collector.limits import IngestLimits
from kvscope.collector.types import Batch, TableKey

def admit(limits: IngestLimits, tables: dict[TableKey, BlockTable], batch: Batch) -> None:
    """Raise MalformedPayload (LIMIT_EXCEEDED, the limit named) if applying `batch` to a map of
    `tables` could take it past `limits`."""
