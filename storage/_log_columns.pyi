from typing import Any

from kvscope.storage._granules import GranuleIndex
from kvscope.storage._token_granules import RunTable

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

def pack_runs(
    runs: list[list[bytes]],
    indexes: list[GranuleIndex | None],
    planes: list[bool],
    notes: list[tuple[RunTable, list[bytes], int, int]] | None = None,
    folds: list[tuple[int, int] | None] | None = None,
) -> list[tuple[list[bytes], int]]:
    """Each run's columns as `split` gives them, checked as `joins_back` checks them, with
    format 5's token planes where `planes` says; and the count kept verbatim. `notes`' content
    noted as `RunTable.note` notes it, in the same let-go of the GIL; `folds`, per run, None or
    (its note, where its first payload lies among the note's): its split reads them for it."""

def checks_made() -> tuple[int, int]:
    """(chunks `pack_runs` joined back and compared, chunks it packed unchecked)."""

def notes_read() -> tuple[int, int]:
    """(payloads `pack_runs`' notes read from the split's walk, payloads they walked apart)."""

def walks_let_go() -> int:
    """How many times `split`, `joins_back` and `pack_runs` have let go of the GIL."""

def rooms_outgrown() -> int:
    """How many columns `split` and `pack_runs` have grown past the room made for them."""

def room_sizes_of(payloads: list[bytes], granules: bool = False) -> list[int]:
    """The most `split` can put in each column of `payloads`."""

def room_shares() -> list[int]:
    """Each column's room now, in 1024ths of a chunk's payload bytes."""

def set_room_shares(shares: list[int]) -> None:
    """Each column's room for the next `pack_runs` (a test's)."""

def scratch_most() -> int:
    """How many chunks' hash tables the last `pack_runs` held at once."""

def fields(rows: list[Any], width: int) -> list[list[Any]] | None:
    """The fields of `rows` (plain tuples of at least `width` items) as `width` lists, or None
    where a row is no such tuple."""
