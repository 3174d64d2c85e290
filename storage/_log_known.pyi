from array import array

class KnownHashes:
    values: bytes
    count: int
    buckets: int
    digest: bytes
    @property
    def nbytes(self) -> int: ...
    def __init__(self, values: bytes) -> None: ...

def split_known(lits: bytes, known: KnownHashes) -> tuple[bytes, bytes, bytes]: ...
def join_known(bitmap: bytes, planes: bytes, rest: bytes, known: KnownHashes) -> bytes: ...

SPREAD_FROM: int

def sorted_hashes(arrays: list[bytes | memoryview | array[int]]) -> bytes: ...
