"""The hash -> slot map of a `BlockTable`: compiled where the build made it, else a dict.

The compiled `SlotMap` (collector/_slotmap.pyx) holds an entry in about 12 bytes instead of a
dict's ~100; both behave the same for everything `BlockTable` asks of them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

try:
    from kvscope.collector._slotmap import SlotMap

    COMPILED = True
except ImportError:  # a source tree that was never built: same behaviour, more memory
    COMPILED = False

    class SlotMap(dict[int, int]):  # type: ignore[no-redef]
        def __init__(self, capacity: int = 0) -> None:
            super().__init__()

        @classmethod
        def from_arrays(cls, hashes: Iterable[int], slots: Iterable[int]) -> SlotMap:
            made = cls()
            made.update(zip(hashes, slots, strict=True))
            return made  # type: ignore[return-value]

        def to_arrays(self) -> tuple[array[int], array[int]]:
            return array("Q", self), array("i", self.values())

        def nbytes(self) -> int:
            return 0


__all__ = ["COMPILED", "SlotMap"]
