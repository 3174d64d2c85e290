from collections.abc import Mapping, Sequence
from typing import Any

MIN_BLOCKS: int

class CheckpointPacer:
    per_block: float
    min_blocks: float
    every_batches: int
    batches_since: int
    events_since: int
    due_events: float
    def __init__(self, per_block: float, every_batches: int, min_blocks: float = ...) -> None: ...
    def batch(self, changes: Mapping[Any, Sequence[int]]) -> bool: ...
    def counted(self, events: int) -> bool: ...
    def force(self) -> None: ...
    def queued(self, blocks: int) -> None: ...
