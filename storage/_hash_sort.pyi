from array import array

SPREAD_FROM: int

def sorted_hashes(arrays: list[bytes | memoryview | array[int]]) -> bytes: ...
