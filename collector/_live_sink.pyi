from typing import Any

class BatchChanges:
    """Blocks stored and removed per table by one batch, counted in C
    (collector/_live_sink.pyx)."""

    def as_dict(self) -> dict[Any, list[int]]: ...

class LiveSink:
    """The base of a sink whose `applied` the live path calls in C (collector/_live_sink.pyx)."""
