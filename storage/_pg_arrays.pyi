from typing import Any

INT4: int
INT8: int
FLOAT8: int
BYTEA: int
TEXT: int
OIDS: dict[int, int]
ARRAY_OIDS: dict[int, int]

def arrays(rows: list[Any], kinds: bytes, ids: dict[Any, int] | None = None) -> list[bytes]: ...
