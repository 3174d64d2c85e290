"""The batch log's rows: runs of one epoch's consecutive batches, compressed together; their
formats, and their reading back (`Chunk`). storage/log_chunk_pack.py packs them.

A row per batch cost the writer a B-tree insert and a kilobyte of page writes for each one, the
largest part of the store's work. A chunk holds up to `MAX_CHUNK_BATCHES` batches (fewer, when
the writer's transaction holds fewer) as one zstd frame, so the log costs a few rows a second
and about a third of the bytes (token ids repeat across a chunk; alone they hardly compress).

Every batch stays exactly as received, with its seq, engine ts and receive time. A chunk also
spans at most `MAX_CHUNK_SPAN_S` of engine time, so that the chunks which may hold the batch
stamped last before an instant are found through two indexes, whatever the engine's clock did.

Format 2 compresses a chunk against its stream's dictionary (storage/log_dictionary.py), whose
digest it names: a stream's token content recurs far beyond what one chunk can see. Its bytes
are `FORMAT_2_MAGIC`, the digest's length (0: no dictionary) and the digest, then the zstd frame.
Format 1 is a bare zstd frame, read as before. Format 3 (storage/log_columns.py) splits the
batches into columns that compress apart, the token ids against the same dictionary; format 4
also names the token blocks that dictionary holds by their number there; format 5 also splits a
chunk's token ids into byte planes where it has no dictionary (before a stream's first one forms,
and in a recording too short for one). Format 6 (storage/log_known.py) also stores the hash
literals found among a checkpoint's hashes as their position there, and names the checkpoint.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec
import zstandard

from kvscope.storage import log_columns
from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_known import KnownHashes
from kvscope.storage.log_columns import (
    FORMAT_3_MAGIC,
    FORMAT_4_MAGIC,
    FORMAT_5_MAGIC,
    FORMAT_6_MAGIC,
)
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known import ChunkError as ChunkError
from kvscope.storage.log_known import Known, checked_hashes
from kvscope.storage.log_known import known_name_of as known_name_of
from kvscope.storage.log_runs import MAX_CHUNK_BATCHES as MAX_CHUNK_BATCHES
from kvscope.storage.log_runs import MAX_CHUNK_RAW_BYTES as MAX_CHUNK_RAW_BYTES
from kvscope.storage.log_runs import MAX_CHUNK_SPAN_S as MAX_CHUNK_SPAN_S
from kvscope.storage.log_runs import split as split

CHUNK_FORMAT = 6
"""The format written unless a store is set to another (`StoreSettings.log_chunk_format`): the
smallest on disk. Checkpoints are paced by the stream's events, so a smaller log does not mean
longer replays (benchmarks/rebuild_instructions.py compares the formats' replays)."""
WRITABLE_FORMATS = (1, 2, 3, 4, 5, 6)
SETTABLE_FORMATS = (2, 3, 4, 5, 6)
"""The formats a store may be set to write: 1 has no dictionary, and is left to migrations."""
FORMAT_2_MAGIC = b"KVL2"
"""Never the start of a zstd frame (28 b5 2f fd), which a format 1 chunk is."""


class LoggedBatch(NamedTuple):
    """A NamedTuple: a rebuild makes one per batch it replays."""

    seq: int
    ts: float
    recv_ts: float
    payload: bytes


class Stamp(NamedTuple):
    """A logged batch's seq and clocks, read without its payload."""

    seq: int
    ts: float
    recv_ts: float


class ChunkRow(NamedTuple):
    """A chunk as it is stored: its bounds in columns (in the table's order), its batches packed
    in `data`."""

    stream: Any
    """The rows' stream (a `StreamId`), put as its id when written."""
    epoch: int
    first_seq: int
    last_seq: int
    min_ts: float
    max_ts: float
    batches: int
    raw_bytes: int
    data: bytes
    min_recv_ts: float
    max_recv_ts: float
    dictionary: bytes | None = None
    """The digest of the dictionary `data` is compressed against (format 2), if any."""
    known_seq: int | None = None
    """The seq of the checkpoint whose hashes `data` names (format 6), if any."""

    def values(self, stream_id: int) -> dict[str, Any]:
        """The row's columns, under the stream's id."""
        return dict(zip(COLUMNS, (stream_id, *self[1:]), strict=True))


COLUMNS = ("stream_id", *ChunkRow._fields[1:])
_NAMING = (FORMAT_2_MAGIC, FORMAT_3_MAGIC, FORMAT_4_MAGIC, FORMAT_5_MAGIC, FORMAT_6_MAGIC)
"""The formats whose chunks name a dictionary."""
_COLUMNAR = {FORMAT_3_MAGIC: 3, FORMAT_4_MAGIC: 4, FORMAT_5_MAGIC: 5, FORMAT_6_MAGIC: 6}


def named_dictionary(data: bytes) -> bytes | None:
    """The digest of the dictionary a chunk's bytes were compressed against, if any."""
    if data[:4] not in _NAMING or len(data) < 5:
        return None
    return bytes(data[5 : 5 + data[4]]) or None


class Chunk:
    """An unpacked chunk: its batches by seq (ascending, as they were applied)."""

    __slots__ = ("seqs", "ts", "recv_ts", "_payloads", "_later")
    _payloads: list[bytes] | None
    _later: Callable[[], list[bytes]] | None

    def __init__(
        self,
        data: bytes,
        dictionary: Dictionary | None = None,
        known: Known | Callable[[], Known] | None = None,
    ) -> None:
        """`dictionary`: the one the chunk names (`named_dictionary`), if it names one;
        `known`: the checkpoint's hashes a chunk of format 6 names (`known_name_of`), or how to
        get them when its payloads are first asked for (its stamps need none)."""
        self._later = None
        expected, frame, zdict = 1, data, None
        named = named_dictionary(data)
        if named is not None:
            if dictionary is None or dictionary.digest != named:
                raise ChunkError(f"log chunk needs dictionary {named.hex()}, not given")
            zdict = dictionary.zstd
        fmt = _COLUMNAR.get(bytes(data[:4]), 0)
        if fmt and len(data) >= 5:
            granules = granules_for(fmt, None if named is None else dictionary)
            try:
                seqs, ts, recv_ts, payloads_of = log_columns.open_stamps(data, zdict, granules)
            except (zstandard.ZstdError, ValueError, IndexError) as exc:
                raise ChunkError(f"not a log chunk: {exc}") from exc
            if fmt == 6 and callable(known):
                given = known
                self.seqs, self.ts, self.recv_ts, self._payloads = seqs, ts, recv_ts, None
                self._later = lambda: _joined(payloads_of, checked_hashes(data, given()))
                if not len(seqs) == len(ts) == len(recv_ts):
                    raise ChunkError("log chunk columns differ in length")
                return
            hashes = None if fmt != 6 or callable(known) else checked_hashes(data, known)
            self._columns(seqs, ts, recv_ts, _joined(payloads_of, hashes))
            return
        if data[:4] == FORMAT_2_MAGIC and len(data) >= 5:
            expected, frame = 2, data[5 + data[4] :]
        try:
            decompressor = zstandard.ZstdDecompressor(dict_data=zdict)
            version, seqs, ts, recv_ts, payloads = msgspec.msgpack.decode(
                log_columns.unpack(decompressor, frame)
            )
        except (zstandard.ZstdError, msgspec.DecodeError, ValueError, TypeError) as exc:
            raise ChunkError(f"not a log chunk: {exc}") from exc
        if version != expected:
            raise ChunkError(f"unknown log chunk format {version!r}")
        self._columns(array("q", seqs), array("d", ts), array("d", recv_ts), payloads)

    def _columns(
        self, seqs: array[int], ts: array[float], recv_ts: array[float], payloads: list[bytes]
    ) -> None:
        self.seqs, self.ts, self.recv_ts, self._payloads = seqs, ts, recv_ts, payloads
        if not len(seqs) == len(ts) == len(recv_ts) == len(payloads):
            raise ChunkError("log chunk columns differ in length")

    @property
    def payloads(self) -> list[bytes]:
        """ChunkError, in format 6, if the hashes it names cannot be had (or are others)."""
        found = self._payloads
        if found is None:
            assert self._later is not None
            found = self._later()
            if len(found) != len(self.seqs):
                raise ChunkError("log chunk columns differ in length")
            self._payloads, self._later = found, None
        return found

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(self, i: int) -> LoggedBatch:
        return LoggedBatch(self.seqs[i], self.ts[i], self.recv_ts[i], self.payloads[i])

    def stamp(self, i: int) -> Stamp:
        """Batch `i`'s stamps (no payload is read: a format 6 chunk needs no checkpoint)."""
        return Stamp(self.seqs[i], self.ts[i], self.recv_ts[i])

    def stamp_of(self, seq: int) -> Stamp | None:  # batch `seq`'s, if the chunk holds it
        i = bisect_right(self.seqs, seq)
        return self.stamp(i - 1) if i and self.seqs[i - 1] == seq else None

    def at_or_before(self, seq: int) -> LoggedBatch | None:
        """The last batch with a seq <= `seq`."""
        i = bisect_right(self.seqs, seq)
        return self.batch(i - 1) if i else None

    def between(self, after: int, upto: int) -> Iterator[LoggedBatch]:
        """Batches with after < seq <= upto, in order."""
        for i in range(*self._range(after, upto)):
            yield self.batch(i)

    def payloads_between(self, after: int, upto: int) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of the same batches."""
        start, end = self._range(after, upto)
        return zip(self.seqs[start:end], self.payloads[start:end], strict=True)

    def _range(self, after: int, upto: int) -> tuple[int, int]:
        return bisect_right(self.seqs, after), bisect_right(self.seqs, upto)


def _joined(
    payloads_of: Callable[[KnownHashes | None], list[bytes]], hashes: KnownHashes | None
) -> list[bytes]:
    try:
        return payloads_of(hashes)
    except (zstandard.ZstdError, ValueError, IndexError) as exc:
        raise ChunkError(f"not a log chunk: {exc}") from exc


def granules_for(fmt: int, dictionary: Dictionary | None) -> GranuleIndex | None:
    """The index a columnar chunk of `fmt` is split or joined with: none in format 3 (whose
    chunks need not build one), an empty one in format 4 without a dictionary."""
    if fmt == 3:
        return None
    return log_columns.NO_GRANULES if dictionary is None else dictionary.granules
