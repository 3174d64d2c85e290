from collections import deque
from typing import Any

class SpillState:
    """The base of storage/spill.py's `Spill`: whether rows wait there (`active`), a C field,
    which the put reads for every batch."""

    active: bool

class QueueCore:
    droppable_limit: int
    bytes_limit: int
    _droppable_in: int
    _droppable_out: int
    _bytes_in: int
    _bytes_out: int
    _others_in: int
    spill: Any
    _rows: deque[Any]
    _wake_at: int
    _wake: Any
    @property
    def _sizes(self) -> list[int]: ...
    @property
    def _sizes_room(self) -> int: ...
    def _put_size(self, nbytes: int) -> None: ...
    def _take_sizes(self, n: int) -> int: ...
    def put_batch(self, row: Any, nbytes: int) -> bool: ...
    def _take_front(self, n: int) -> tuple[list[Any], int]: ...
    def _arm_wake(self, max_rows: int) -> bool: ...
    def _keep(self, row: Any, nbytes: int) -> None: ...
