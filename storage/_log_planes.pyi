from array import array

def xor_planes(data: bytes, inverse: bool = False) -> bytes: ...
def token_planes(toks: bytes) -> tuple[bytes, bytes] | None:
    """(low bytes, width and the planes above), or None where the ids do not fit."""

def tokens_of_planes(low: bytes, rest: bytes) -> bytes: ...
def low_high(values: array[float]) -> tuple[float, float]:
    """(min(values), max(values)), read in C."""
