from typing import Any

class MapCounters:
    """A map's batches, events and blocks applied, clears, the last batch's `ts`, and whether
    its publisher sent signed hashes."""

    batches: int
    stored_events: int
    removed_events: int
    cleared_events: int
    stored_blocks: int
    removed_blocks: int
    clears: int
    last_ts: float | None
    signed_hashes: bool
    """The publisher sent negative ints (vLLM < 0.10.2): show hashes signed."""

    def __init__(self) -> None: ...
    def as_dict(self) -> dict[str, Any]:
        """Every field by name, in the order they are declared."""
