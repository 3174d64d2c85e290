from typing import Any

def run_bounds(
    streams: list[Any],
    epochs: list[Any],
    ts: list[float],
    payloads: list[bytes],
    max_batches: int,
    max_bytes: int,
    max_span: float,
) -> list[tuple[int, int]] | None: ...
