from collections.abc import Callable
from typing import Any

INT4: int
INT8: int
FLOAT8: int
BYTEA: int
TEXT: int
ARRAY_OIDS: dict[int, int]

def arrays(
    rows: list[Any],
    kinds: bytes,
    ids: dict[Any, int] | None = None,
    stream_id: Callable[[Any], int] | None = None,
) -> list[bytes]: ...
