from collections.abc import Iterable
from typing import Any

def add_chain(
    under: dict[int, int | set[int]], parent: int | None, hashes: Iterable[int]
) -> None: ...
def orphans_after(orphans: Any, view: Any, events: Iterable[Any], ts: float) -> None: ...
