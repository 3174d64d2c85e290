"""Format 3 of the log's chunks (storage/log_chunks.py): a chunk's batches as columns.

Zstd over a chunk's msgpack sees random 64-bit hashes, token ids and map keys interleaved, and
finds little: the hashes cost their 8 bytes each, however often they repeat (a parent is the
hash stored just before), and a token id's matches are cut short by them. Format 3 splits each
payload, byte for byte, into columns (storage/_log_columns.pyx): a skeleton (keys, headers,
small values), hashes as references to their earlier occurrence in the chunk or literals,
floats XORed with the one before, and token ids. Each compresses alone, the token ids against
the stream's dictionary (format 2's, storage/log_dictionary.py). A chunk still decodes from its
own bytes and its named dictionary alone. A payload that is not msgpack the split reads whole
is kept verbatim in the skeleton, and a chunk whose columns would not give back every payload
exactly (checked when packed) keeps all of them verbatim.

Format 4 also stores each whole granule of a token run that the dictionary holds as its number
there (storage/_granules.pxd), in an eighth frame after the tokens: the dictionary's content
already costs a chunk nothing, and a number a few bytes less than zstd's match for it.

Format 5 is format 4 with a ninth frame: where a chunk has no dictionary (a stream's first
minutes, a lab recording), its token ids as byte planes, the low bytes in the token frame and
the others in the ninth (`token_planes`), which compress better than msgpack's bytes of ids
that do not recur. A chunk against a dictionary (whose content is msgpack's bytes), or whose
ids do not fit, is written in format 4.

Bytes: `FORMAT_3_MAGIC` (`FORMAT_4_MAGIC`, `FORMAT_5_MAGIC`), the digest's length (0: no
dictionary) and the digest, then varints: the batch count, and the compressed length of each
frame, then the frames: the batches' seqs, ts and receive times (XORed with the one before, as
byte planes), then `split`'s columns.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import NamedTuple

import zstandard

from kvscope.storage._granules import GranuleIndex
from kvscope.storage._log_columns import join, pack_runs
from kvscope.storage._log_known import KnownHashes, join_known, split_known
from kvscope.storage._log_planes import tokens_of_planes, xor_planes
from kvscope.storage._token_granules import RunTable

FORMAT_3_MAGIC = b"KVL3"
FORMAT_4_MAGIC = b"KVL4"
FORMAT_5_MAGIC = b"KVL5"
FORMAT_6_MAGIC = b"KVL6"
FRAMES = {FORMAT_3_MAGIC: 7, FORMAT_4_MAGIC: 8, FORMAT_5_MAGIC: 9}
"""The frames of each format but 6, whose chunk says how many (format 4's or 5's and two): the
stamps, then the sizes, skeleton, hash references, hash literals, floats and tokens; in format 4
then the granules' numbers; in format 5 then the token ids' upper planes."""
_MAGIC_OF = {n: magic for magic, n in FRAMES.items()}
TOKENS = 6
"""The frame compressed against the dictionary."""
LITERALS = 4
"""The hash literals' frame: in format 6, those not found among the known hashes."""
KNOWN_FRAMES = 2
"""Format 6's last frames: which literals were found among the known hashes, and where."""
NO_GRANULES = GranuleIndex(b"")
"""Format 4's index of a chunk without a dictionary."""
MAX_FRAME_BYTES = 1 << 30
"""The most a chunk's frame may hold, unpacked: a chunk holds 2 MiB of batches, or one larger
batch (64 MiB at most by default, `--max-message-bytes`). A frame whose header says more is
damaged: zstd would allocate what it says before finding out."""


def literals_left_raw(frames: int, known: bool) -> tuple[int, ...]:
    """The frames of a chunk of `frames` frames (`known`: format 6's) whose bytes zstd's
    matches leave are random: format 6's positions among the known hashes, whose high bytes
    zstd's matches take and whose low bytes are drawn at random (the hashes are). zstd's
    Huffman coding of those would cost a table per block and shrink them hardly at all
    (storage/log_chunk_pack.py compresses them without). Not the token ids' planes nor the
    granules' numbers: a real stream's ids are far from evenly drawn (benchmarks/store.py's
    lab recordings), and a granule's number follows its content's."""
    return (frames - 1,) if known else ()


def columns(
    seqs: array[int],
    ts: array[float],
    recv_ts: array[float],
    payloads: Sequence[bytes],
    granules: GranuleIndex | None = None,
    planes: bool = False,
    known: KnownHashes | None = None,
) -> tuple[list[bytes], int]:
    """A chunk's frames, uncompressed, and how many payloads they keep verbatim; format 4's
    with `granules`; with `planes` too, format 5's where the token ids fit in planes (else
    format 4's); with `known` too, format 6's (format 4's or 5's, the literals found among
    `known` taken out into two more frames)."""
    return columns_all([Run(seqs, ts, recv_ts, payloads, granules, planes, known)])[0]


Note = tuple[RunTable, list[bytes], int, int]
"""A stream's content to note as `RunTable.note` does: (table, payloads, step, when)."""


class Run(NamedTuple):
    """A chunk's batches, and what `columns` is given with them."""

    seqs: array[int]
    ts: array[float]
    recv_ts: array[float]
    payloads: Sequence[bytes]
    granules: GranuleIndex | None
    planes: bool
    known: KnownHashes | None = None


def columns_all(
    runs: Sequence[Run],
    notes: Sequence[Note] | None = None,
    folds: Sequence[tuple[int, int] | None] | None = None,
) -> list[tuple[list[bytes], int]]:
    """`columns` of each run: the walks of them all (the split, its check that the columns
    give the payloads back, else all verbatim, and the planes) let go of the GIL once; so do
    `notes`' (storage/log_dictionary.py's noting of a stream's content, once the runs are
    packed). `folds`, per run: None, or (the note whose payloads hold the run's, where its first
    lies among them): the run's split reads them for that note, which then walks only those
    the split could not read as it would."""
    packed = pack_runs(
        [list(run.payloads) for run in runs],
        [run.granules for run in runs],
        [run.planes for run in runs],
        None if notes is None else list(notes),
        None if folds is None else list(folds),
    )
    out = []
    for run, (parts, verbatim) in zip(runs, packed, strict=True):
        stamps = b"".join(xor_planes(a.tobytes()) for a in (run.seqs, run.ts, run.recv_ts))
        frames = [stamps, *parts]
        if run.known is not None and run.granules is not None:
            found, where, frames[LITERALS] = split_known(frames[LITERALS], run.known)
            frames += [found, where]
        out.append((frames, verbatim))
    return out


def assemble(
    digest: bytes,
    count: int,
    frames: Sequence[bytes | memoryview],
    known_name: bytes | None = None,
) -> bytes:
    """A chunk's bytes, from its compressed frames (their number tells the format, but 6's:
    with `known_name`, the name of the known hashes its last two frames were split against)."""
    head = bytearray(_MAGIC_OF[len(frames)] if known_name is None else FORMAT_6_MAGIC)
    head.append(len(digest))
    head += digest
    if known_name is not None:
        head.append(len(known_name))
        head += known_name
        _put_varint(head, len(frames))
    for n in (count, *map(len, frames)):
        _put_varint(head, n)
    return b"".join([head, *frames])  # one copy of the frames, not two


def known_named(data: bytes) -> bytes | None:
    """The name of the known hashes a chunk of format 6 was split against; None in another."""
    if bytes(data[:4]) != FORMAT_6_MAGIC or len(data) < 6:
        return None
    pos = 5 + data[4]
    if pos >= len(data):
        raise ValueError("log chunk header cut short")
    return bytes(data[pos + 1 : pos + 1 + data[pos]])


def open_columns(
    data: bytes,
    zdict: zstandard.ZstdCompressionDict | None,
    granules: GranuleIndex | None,
    known: KnownHashes | None = None,
) -> tuple[array[int], array[float], array[float], list[bytes]]:
    """seqs, ts, receive times and payloads of a format 3 to 6 chunk (`granules`: the index
    of its dictionary, in formats 4 to 6; `known`: the hashes a format 6 chunk names, checked
    by its caller); ValueError if damaged."""
    seqs, ts, recv_ts, payloads_of = open_stamps(data, zdict, granules)
    return seqs, ts, recv_ts, payloads_of(known)


def open_stamps(
    data: bytes, zdict: zstandard.ZstdCompressionDict | None, granules: GranuleIndex | None
) -> tuple[array[int], array[float], array[float], Callable[[KnownHashes | None], list[bytes]]]:
    """`open_columns`, the payloads left to join when asked (with the known hashes then): a
    reader of a format 6 chunk's stamps alone (where is seq s?) needs no checkpoint."""
    magic = bytes(data[:4])
    pos = 5 + data[4]
    if magic == FORMAT_6_MAGIC:
        pos += 1 + data[pos]
        n_frames, pos = _get_varint(data, pos)
        if n_frames - KNOWN_FRAMES not in (FRAMES[FORMAT_4_MAGIC], FRAMES[FORMAT_5_MAGIC]):
            raise ValueError("log chunk of format 6 with an unknown layout")
        layout = _MAGIC_OF[n_frames - KNOWN_FRAMES]
    else:
        n_frames, layout = FRAMES[magic], magic
    count, pos = _get_varint(data, pos)
    lengths = []
    for _ in range(n_frames):
        n, pos = _get_varint(data, pos)
        lengths.append(n)
    plain = zstandard.ZstdDecompressor()
    frames = []
    for i, n in enumerate(lengths):
        frame = data[pos : pos + n]
        if len(frame) != n:
            raise ValueError("log chunk cut short")
        pos += n
        if i == TOKENS and zdict is not None:
            frames.append(unpack(zstandard.ZstdDecompressor(dict_data=zdict), frame))
        else:
            frames.append(unpack(plain, frame, 24 * count if i == 0 else None))
    if pos != len(data) or len(frames[0]) != 24 * count:
        raise ValueError("log chunk's frames do not match its count")
    stamps = frames[0]
    plain_stamps = [xor_planes(stamps[8 * count * k : 8 * count * (k + 1)], True) for k in range(3)]
    seqs, ts, recv_ts = array("q"), array("d"), array("d")
    seqs.frombytes(plain_stamps[0])
    ts.frombytes(plain_stamps[1])
    recv_ts.frombytes(plain_stamps[2])

    def payloads(known: KnownHashes | None) -> list[bytes]:
        columns = frames[1:]
        if magic == FORMAT_6_MAGIC:
            if known is None:
                raise ValueError("log chunk of format 6 read without its known hashes")
            *columns, found, where = columns
            columns[LITERALS - 1] = join_known(found, where, columns[LITERALS - 1], known)
        if layout == FORMAT_5_MAGIC:
            *columns, rest = columns
            columns[TOKENS - 1] = tokens_of_planes(columns[TOKENS - 1], rest)
        if layout != FORMAT_3_MAGIC:
            index = NO_GRANULES if granules is None else granules  # not `or`: an empty is falsy
            return join(count, *columns, granules=index)
        return join(count, *columns)

    return seqs, ts, recv_ts, payloads


def unpack(
    decompressor: zstandard.ZstdDecompressor, frame: bytes, exactly: int | None = None
) -> bytes:
    """A zstd frame of a chunk unpacked, if its header says a size a frame may hold (`exactly`,
    where the chunk's header tells it; -1: it says none); ValueError if not, before anything is
    allocated."""
    says = zstandard.frame_content_size(frame)
    if says > MAX_FRAME_BYTES or (exactly is not None and says not in (exactly, -1)):
        raise ValueError(f"log chunk frame says it holds {says} bytes")
    return decompressor.decompress(frame)


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("log chunk header cut short")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
