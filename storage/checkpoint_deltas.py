"""Which checkpoints are written whole (keys) and which as the rows changed since a key (deltas).

The writer thread keeps, per stream, the last key it encoded. A delta grows with the rows changed
since its key, so after a while a new key costs less: a checkpoint is a delta on the key (same
epoch) while the delta is at most `delta_share` times the mean size of the checkpoints since the
key (the key and its deltas), which is what writing it lowers (with 1.0, the key and its deltas
take the fewest bytes per checkpoint a delta that only grows allows); past that, or where a delta
cannot say the map (a table the key lacks, an emptied one), it is a new key. A rebuild thus reads
one key and at most one delta. Checkpoints come as often either way (they are paced by the
stream's events, storage/_checkpoint_pacing.pyx): a delta only saves bytes.

Without deltas (`delta_share` 0), a checkpoint is a format-5 snapshot that numbers the token
blocks its stream's current log dictionary holds (storage/checkpoint_blocks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.collector.snapshot import encode_copy
from kvscope.collector.snapshot_delta import Key, encode_delta, encode_key
from kvscope.collector.types import StreamId
from kvscope.storage.checkpoint_blocks import read_known
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.rows import CheckpointRow


@dataclass(slots=True)
class _Held:
    epoch: int
    seq: int
    key: Key
    written: int
    """Bytes of the key and its deltas."""
    count: int = 1


class CheckpointEncoder:
    def __init__(self, delta_share: float) -> None:
        self.delta_share = delta_share
        """Largest delta, as a share of the mean checkpoint since its key; 0: keys only."""
        self._keys: dict[StreamId, _Held] = {}

    def encode(self, row: CheckpointRow, dictionary: Dictionary | None = None) -> None:
        """Fill `row.packed` (and `row.key_seq` for a delta). A key
        checkpoint without deltas numbers the blocks `dictionary` (its stream's current, which
        must be stored with it) holds, and names it (`blocks_named`)."""
        if self.delta_share <= 0:
            known = None if dictionary is None else read_known(dictionary)
            row.packed, row.key_seq = encode_copy(row.snapshot, known=known), None
            return
        held = self._keys.get(row.stream)
        if held is not None and held.epoch == row.epoch and held.seq < row.seq:
            delta = encode_delta(row.snapshot, held.key)
            if delta is not None and len(delta) <= self.delta_share * held.written / held.count:
                row.packed, row.key_seq = delta, held.seq
                held.written += len(delta)
                held.count += 1
                return
        row.packed, key = encode_key(row.snapshot)
        row.key_seq = None
        self._keys[row.stream] = _Held(row.epoch, row.seq, key, len(row.packed))

    def forget(self, stream: StreamId | None = None) -> None:
        """The key of `stream` (None: of every stream) may not be stored: the next is a key."""
        if stream is None:
            self._keys.clear()
        else:
            self._keys.pop(stream, None)
