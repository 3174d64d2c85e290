from collections.abc import Iterable

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import Batch, TableKey

def replay(prefix_map: PrefixMap, payloads: Iterable[tuple[int, bytes]], epoch: int) -> int:
    """Apply each (seq, payload) to `prefix_map` as
    `prefix_map.apply(BatchDecoder(prefix_map.limits).decode(payload, seq), epoch)` would;
    returns how many were applied."""

class FusedApply:
    """Live batches applied straight from their bytes (one map at a time)."""

    @property
    def taken(self) -> int:
        """Batches applied here, not left to decode + apply."""

    def live(
        self,
        prefix_map: PrefixMap,
        payload: bytes,
        seq: int,
        epoch: int,
        degraded: bool,
        recv_ts: float | None,
        max_block_size: int,
    ) -> int:
        """`prefix_map.apply(decode(payload, seq), epoch, degraded, recv_ts)`, its counters
        added: 2 * (the batch's rank + 1, 0 for None) + 1 if it holds an `AllBlocksCleared`;
        -1 (nothing done) to leave the batch to decode + apply."""

    def route_read(self, seq_frame: bytes, payload: bytes, max_block_size: int) -> int:
        """A fleet's message read for its router: its batch's rank (or 0), or -1 to decode
        it (its batch not the compiled decoder's, or its seq frame not a seq)."""

    def seq_read(self, payload: bytes) -> int:
        """The seq `route_read` read last, if `payload` is its batch; else -1."""

    def apply_read(
        self,
        prefix_map: PrefixMap,
        payload: bytes,
        seq: int,
        epoch: int,
        degraded: bool,
        recv_ts: float | None,
        max_block_size: int,
    ) -> int:
        """`live` for the batch `route_read` read last, if `payload` is that one."""

    def prepare(
        self,
        prefix_map: PrefixMap,
        payload: bytes,
        epoch: int,
        degraded: bool,
        recv_ts: float | None,
        max_block_size: int,
    ) -> float | None:
        """`live`'s read and limits check (or `apply_read`'s, for the batch `route_read` read
        last): the batch's stamp, the object held for `apply_prepared` or `release`; None, nothing
        held, to leave it to decode + apply."""

    def apply_prepared(self, seq: int, changes: dict[TableKey, list[int]]) -> int:
        """Apply the batch `prepare` held, `changes` filled with its `[stored, removed]` blocks
        per table: what `live` returns."""

    def release(self) -> None:
        """Give up the batch `prepare` held, unapplied."""

    def batch(self, payload: bytes, seq: int, max_block_size: int) -> Batch | None:
        """What `decode_map_batch` makes of the batch `route_read` read last, if `payload`."""
