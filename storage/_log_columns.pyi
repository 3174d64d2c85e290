from kvscope.storage._granules import GranuleIndex

def split(
    payloads: list[bytes], verbatim: bool = False, granules: GranuleIndex | None = None
) -> tuple[tuple[bytes, ...], int]:
    """(sizes, skeleton, references, literals, floats, tokens), and the granules' numbers
    with `granules`."""

def join(count: int, *columns: bytes, granules: GranuleIndex | None = None) -> list[bytes]:
    """`split`'s columns, in its order."""

def xor_planes(data: bytes, inverse: bool = False) -> bytes: ...
def token_planes(toks: bytes) -> tuple[bytes, bytes] | None:
    """(low bytes, width and the planes above), or None where the ids do not fit."""

def tokens_of_planes(low: bytes, rest: bytes) -> bytes: ...
