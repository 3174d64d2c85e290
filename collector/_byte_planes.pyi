from array import array
from typing import Any

from _typeshed import ReadableBuffer

def split_planes(data: ReadableBuffer, width: int) -> bytes: ...
def join_planes(
    data: ReadableBuffer, width: int, typecode: str | None = None
) -> bytes | array[Any]: ...
