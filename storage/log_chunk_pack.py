"""Packing the log's rows into chunks (storage/log_chunks.py, which reads them back): each
stream and epoch's runs (storage/log_runs.py) as `ChunkRow`s of a format, compressed against
each stream's dictionary, and in format 6 against its checkpoint's hashes."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from kvscope.storage import log_columns
from kvscope.storage._log_planes import low_high
from kvscope.storage.log_chunks import (
    CHUNK_FORMAT,
    FORMAT_2_MAGIC,
    WRITABLE_FORMATS,
    ChunkRow,
    granules_for,
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
from kvscope.storage.log_known import Known, known_before
from kvscope.storage.log_runs import bounds, columns_by_stream
from kvscope.storage.rows import LogRow


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
    made, runs, names, firsts = [], [], [], []
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
            granules = granules_for(fmt, dictionary)
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
            firsts.append(start)
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
        notes: list[log_columns.Note] = []
        # Each stream's note, and where its payloads start: its runs' splits read them for it.
        noting: dict[Any, tuple[int, int]] = {}
        for stream, (start, end) in spans.items():
            if note is None:
                break
            noted = note(stream, payloads if end - start == len(payloads) else payloads[start:end])
            if noted is not None:
                noting[stream] = (len(notes), start)
                notes.append(noted)
        folds = [
            None if (at := noting.get(chunk.stream)) is None else (at[0], first - at[1])
            for chunk, first in zip(made, firsts, strict=True)
        ]
        frames = [parts for parts, _ in log_columns.columns_all(runs, notes, folds)]
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
    # The others without the dictionary, in two calls: those whose literals are left raw.
    uncoded = [
        log_columns.literals_left_raw(len(chunk), name is not None)
        for chunk, name in zip(frames, names, strict=True)
    ]
    plain: dict[bool, list[bytes]] = {True: [], False: []}
    for chunk, kept, left in zip(frames, raw, uncoded, strict=True):
        for k, f in enumerate(chunk):
            if k != tokens and (k != lits or kept is None):
                plain[k not in left].append(f)
    done = {
        coded: iter(compress_all(None, items, COLUMNS_ZSTD_LEVEL, coded))
        for coded, items in plain.items()
    }
    packed = [
        [
            kept if k == lits and kept is not None else next(done[k not in left])
            for k in range(len(chunk))
            if k != tokens
        ]
        for chunk, kept, left in zip(frames, raw, uncoded, strict=True)
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
