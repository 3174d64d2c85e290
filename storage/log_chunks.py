"""The batch log's rows: runs of one epoch's consecutive batches, compressed together.

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

import struct
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import zstandard

from kvscope.storage import log_columns
from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_known import KnownHashes
from kvscope.storage._log_planes import low_high
from kvscope.storage.log_columns import (
    FORMAT_3_MAGIC,
    FORMAT_4_MAGIC,
    FORMAT_5_MAGIC,
    FORMAT_6_MAGIC,
)
from kvscope.storage.log_compress import (
    COLUMNS_ZSTD_LEVEL,
    DICTIONARY_ZSTD_LEVEL,
    TOKENS_ZSTD_LEVEL,
    ZSTD_LEVEL,
    by_dictionary,
    compress_all,
    random_like,
    raw_frame,
)
from kvscope.storage.log_dictionary import Dictionary
from kvscope.storage.log_known import ChunkError as ChunkError
from kvscope.storage.log_known import Known, checked_hashes, known_before
from kvscope.storage.log_known import known_name_of as known_name_of
from kvscope.storage.log_runs import MAX_CHUNK_BATCHES as MAX_CHUNK_BATCHES
from kvscope.storage.log_runs import MAX_CHUNK_RAW_BYTES as MAX_CHUNK_RAW_BYTES
from kvscope.storage.log_runs import MAX_CHUNK_SPAN_S as MAX_CHUNK_SPAN_S
from kvscope.storage.log_runs import bounds, columns_by_stream
from kvscope.storage.log_runs import split as split
from kvscope.storage.rows import LogRow

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
            granules = _granules(fmt, None if named is None else dictionary)
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


def pack(
    rows: Sequence[LogRow],
    fmt: int = CHUNK_FORMAT,
    dictionaries: Mapping[Any, Dictionary] | None = None,
    known: Mapping[Any, Known] | None = None,
    note: Callable[[Any, list[bytes]], log_columns.Note | None] | None = None,
) -> list[ChunkRow]:
    """`rows` (in the order applied) as chunks of format `fmt`, compressed; in formats 2 and 3,
    each stream's against its dictionary in `dictionaries`, if it has one; in format 6, each
    chunk of a stream in `known` that lies after its checkpoint (same epoch) against its hashes
    (the caller cuts `rows` at its checkpoints: a chunk never spans one). In formats 3 and up,
    `note` is given each stream's payloads (in the order applied, the streams in the order they
    first come), and what it gives back is noted in the columns' walk
    (`log_columns.columns_all`); in another, it is not called.

    The writer thread holds the GIL for all of this but the compression, and the ingest thread
    waits meanwhile: rows are handled as columns (`zip`, `array`, `accumulate`, `bisect` run in
    C), the columnar chunks are walked in one call and compressed in one call per dictionary,
    which lets the GIL go once each rather than per chunk (taking it back from a busy ingest
    thread can cost a whole switch interval).
    """
    if fmt not in WRITABLE_FORMATS:
        raise ValueError(f"log chunk format {fmt} is not one this version writes")
    if not rows:
        return []
    streams, epochs, seqs, ts, recv_ts, payloads = columns_by_stream(rows)
    all_seqs, all_ts, all_recv = stamp_arrays(seqs, ts, recv_ts)
    made, runs, names = [], [], []
    spans: dict[Any, list[int]] = {}
    """Each stream's rows, start and end: `columns_by_stream` put them together."""
    for start, end in bounds(streams, epochs, ts, payloads):
        span = spans.get(streams[start])
        if span is None:
            spans[streams[start]] = [start, end]
        else:
            span[1] = end
        run_seqs, run_ts, run_recv = all_seqs[start:end], all_ts[start:end], all_recv[start:end]
        (ts_low, ts_high), (recv_low, recv_high) = low_high(run_ts), low_high(run_recv)
        after = known_before(fmt, known, streams[start], epochs[start], run_seqs[0])
        if fmt >= 3:
            dictionary = (dictionaries or {}).get(streams[start])
            granules = _granules(fmt, dictionary)
            planes = fmt >= 5 and dictionary is None
            runs.append(
                log_columns.Run(
                    run_seqs,
                    run_ts,
                    run_recv,
                    payloads[start:end],
                    granules,
                    planes,
                    None if after is None else after.hashes,
                )
            )
            names.append(None if after is None else after.name)
            raw = b""
        else:
            raw = msgspec.msgpack.encode(
                (fmt, run_seqs.tobytes(), run_ts.tobytes(), run_recv.tobytes(), payloads[start:end])
            )
        made.append(
            ChunkRow(
                streams[start],
                epochs[start],
                run_seqs[0],
                run_seqs[-1],
                ts_low,
                ts_high,
                end - start,
                len(raw),  # formats 3 to 5: their frames' below
                raw,
                recv_low,
                recv_high,
                None,
                None if after is None else after.seq,
            )
        )
    if fmt >= 3:
        notes = []
        for stream, (start, end) in spans.items():
            if note is None:
                break
            noted = note(stream, payloads if end - start == len(payloads) else payloads[start:end])
            if noted is not None:
                notes.append(noted)
        frames = [parts for parts, _ in log_columns.columns_all(runs, notes)]
        made = [c._replace(raw_bytes=sum(map(len, f))) for c, f in zip(made, frames, strict=True)]
        return _pack_columns(made, frames, dictionaries or {}, names, fmt)
    encoded = [chunk.data for chunk in made]
    if fmt == 1:  # a bare zstd frame, against no dictionary
        return _compressed_by_dictionary(
            made, {}, encoded, ZSTD_LEVEL, lambda i, _, frame: bytes(frame)
        )
    return _compressed_by_dictionary(
        made, dictionaries or {}, encoded, DICTIONARY_ZSTD_LEVEL, _format_2
    )


def stamp_arrays(
    seqs: Sequence[int], ts: Sequence[float], recv_ts: Sequence[float]
) -> tuple[array[int], array[float], array[float]]:
    """A transaction's seqs, times and receive times as arrays, as `array` makes them: through
    `struct`, which converts each value in C, where `array` parses each as a call's argument
    (while the writer holds the GIL)."""
    n = len(seqs)
    return (
        array("q", struct.pack(f"{n}q", *seqs)),
        array("d", struct.pack(f"{n}d", *ts)),
        array("d", struct.pack(f"{n}d", *recv_ts)),
    )


def _granules(fmt: int, dictionary: Dictionary | None) -> GranuleIndex | None:
    """The index a columnar chunk of `fmt` is split or joined with: none in format 3 (whose
    chunks need not build one), an empty one in format 4 without a dictionary."""
    if fmt == 3:
        return None
    return log_columns.NO_GRANULES if dictionary is None else dictionary.granules


def _pack_columns(
    made: list[ChunkRow],
    frames: list[list[bytes]],
    dictionaries: Mapping[Any, Dictionary],
    names: Sequence[bytes | None],
    fmt: int,
) -> list[ChunkRow]:
    """Formats 3 to 6 (`fmt`): the token frame against the dictionary, the others without
    (`names`: each chunk's known hashes' name in format 6)."""
    # One call per compressor over all the chunks' frames: the GIL goes once per call.
    # Format 5 writes some chunks with a frame more than others: each chunk's own count.
    tokens = log_columns.TOKENS
    # Format 3 names no granules: its token ids leave zstd the dictionary's matches to find.
    level = TOKENS_ZSTD_LEVEL if fmt == 3 else COLUMNS_ZSTD_LEVEL
    # Hash literals drawn at random do not compress: stored as zstd's raw blocks, unsearched.
    lits = log_columns.LITERALS
    raw = [raw_frame(chunk[lits]) if random_like(chunk[lits]) else None for chunk in frames]
    plain = iter(
        compress_all(
            None,
            [
                f
                for chunk, kept in zip(frames, raw, strict=True)
                for k, f in enumerate(chunk)
                if k != tokens and (k != lits or kept is None)
            ],
            COLUMNS_ZSTD_LEVEL,
        )
    )
    packed = [
        [kept if k == lits and kept is not None else next(plain) for k in range(len(chunk) - 1)]
        for chunk, kept in zip(frames, raw, strict=True)
    ]

    def assemble(i: int, digest: bytes, token_frame: bytes | memoryview) -> bytes:
        ordered = [*packed[i][:tokens], token_frame, *packed[i][tokens:]]
        return log_columns.assemble(digest, made[i].batches, ordered, names[i])

    token_frames = [chunk[tokens] for chunk in frames]
    return _compressed_by_dictionary(made, dictionaries, token_frames, level, assemble)


def _format_2(i: int, digest: bytes, frame: bytes | memoryview) -> bytes:
    """A chunk of format 2's bytes: its magic, the digest's length and the digest, the frame."""
    return b"".join([FORMAT_2_MAGIC, bytes((len(digest),)), digest, frame])


def _compressed_by_dictionary(
    made: list[ChunkRow],
    dictionaries: Mapping[Any, Dictionary],
    frames: list[bytes],
    level: int,
    assemble: Callable[[int, bytes, bytes | memoryview], bytes],
) -> list[ChunkRow]:
    """`made` with each chunk's bytes `assemble(i, digest, frame)`: `frames[i]` compressed at
    `level` against its stream's dictionary in `dictionaries` (digest empty where none), in one
    call per dictionary (the GIL goes once each), and named by that dictionary's digest."""
    out = list(made)
    for dictionary, where in by_dictionary([c.stream for c in made], dictionaries).items():
        done = compress_all(dictionary, [frames[i] for i in where], level)
        digest = b"" if dictionary is None else dictionary.digest
        for k, i in enumerate(where):
            out[i] = made[i]._replace(data=assemble(i, digest, done[k]), dictionary=digest or None)
    return out
