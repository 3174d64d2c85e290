from typing import Any

from kvscope.collector._table_core import TableCore

def longest_prefix(table: TableCore, query: Any, lora_name: str | None = None) -> int: ...
