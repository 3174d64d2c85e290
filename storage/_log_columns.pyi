from kvscope.storage._granules import GranuleIndex

def split(
    payloads: list[bytes], verbatim: bool = False, granules: GranuleIndex | None = None
) -> tuple[tuple[bytes, ...], int]:
    """(sizes, skeleton, references, literals, floats, tokens), and the granules' numbers
    with `granules`."""

def join(count: int, *columns: bytes, granules: GranuleIndex | None = None) -> list[bytes]:
    """`split`'s columns, in its order."""

def joins_back(
    payloads: list[bytes], *columns: bytes, granules: GranuleIndex | None = None
) -> bool:
    """Whether `join` gives `payloads` back from `split`'s columns, exactly."""
