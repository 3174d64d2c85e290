from collections.abc import Iterable, Iterator
from typing import Any

def add_chain(
    under: dict[int, int | set[int]], parent: int | None, hashes: Iterable[int]
) -> None: ...
def orphans_after(orphans: Any, view: Any, events: Iterable[Any], ts: float) -> None: ...
def follow_batches(
    follower: Any, batches: Iterator[Any], last_instant: float, rows: bool
) -> Iterator[Any] | None: ...
