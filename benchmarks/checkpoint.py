"""What a checkpoint costs: its size, and the time to encode and decode it, in each format.

    python benchmarks/checkpoint.py [--cached C ...] [--seed S] [--repeats R]

For a map of about C cached blocks (benchmarks/ingest.py's stream applied in memory), each
snapshot format the store reads is encoded and decoded `--repeats` times, back to back, and
printed beside the format before it (the baseline, measured in the same run): bytes, bytes per
cached block, and the median encode and decode times; format 5 also as the store writes it,
numbering the token blocks of the log dictionary the writer would hold then ("5+dictionary",
beside format 3, today's before it). Every decoded map is checked against the map encoded. The
last line is one JSON object with those figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.snapshot import SNAPSHOT_FORMATS, KnownBlocks, decode_map, encode_map
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder
from kvscope.storage.checkpoint_blocks import known_of
from kvscope.storage.log_dictionary import StreamContent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream

STREAM = StreamId("bench", 0)


TRANSACTION = 300
"""Batches per writer transaction, about: the log's dictionary is renewed between them."""


def full_map(cached: int, seed: int) -> tuple[PrefixMap, KnownBlocks | None]:
    """The map once the cache has filled and turned over (benchmarks/store.py's stream), and
    the blocks of the log dictionary a writer would hold then (storage/log_dictionary.py;
    about half the log's bytes stored per byte of payload, as zstd leaves token ids)."""
    payloads, _ = make_stream(4 * cached, seed, cached, 10**12)
    prefix_map, decode = PrefixMap(STREAM), BatchDecoder().decode
    content = StreamContent()
    for start in range(0, len(payloads), TRANSACTION):
        batch = payloads[start : start + TRANSACTION]
        for seq, payload in enumerate(batch, start):
            prefix_map.apply(decode(payload, seq))
        content.see(batch)
        content.stored(sum(map(len, batch)) // 2)
        content.refresh()
    return prefix_map, None if content.current is None else known_of(content.current)


def _median_ms(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, result


def _given(known: KnownBlocks, name: bytes) -> KnownBlocks:
    assert name == known.name
    return known


def measure(
    prefix_map: PrefixMap, known: KnownBlocks | None, repeats: int
) -> dict[str, dict[str, float]]:
    blocks = prefix_map.totals().blocks
    counts = prefix_map.counts()
    figures = {}
    kinds: list[tuple[str, int, KnownBlocks | None]] = [(str(v), v, None) for v in SNAPSHOT_FORMATS]
    if known is not None:
        kinds.append(("5+dictionary", 5, known))
    for kind, version, blocks_known in kinds:
        encode = partial(encode_map, prefix_map, version=version, known=blocks_known)
        encode_ms, data = _median_ms(encode, repeats)
        assert isinstance(data, bytes)
        named = None if blocks_known is None else partial(_given, blocks_known)
        decode = partial(decode_map, data, STREAM, named)
        decode_ms, back = _median_ms(decode, repeats)
        assert isinstance(back, PrefixMap) and back.counts() == counts
        figures[kind] = {
            "bytes": len(data),
            "bytes_per_block": len(data) / blocks,
            "encode_ms": encode_ms,
            "decode_ms": decode_ms,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cached", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {}
    for cached in args.cached:
        prefix_map, known = full_map(cached, args.seed)
        figures = results[cached] = measure(prefix_map, known, args.repeats)
        print(f"a map of {prefix_map.totals().blocks:,} cached blocks:")
        kinds = list(figures)
        for at, (kind, f) in enumerate(figures.items()):
            before = "3" if kind == "5+dictionary" else kinds[at - 1] if at else None
            base = None if before is None else figures[before]
            versus = (
                ""
                if base is None
                else f"  (format {before}: {base['bytes']:,} bytes, encode "
                f"{base['encode_ms']:.0f} ms, decode {base['decode_ms']:.0f} ms)"
            )
            print(
                f"  format {kind}: {f['bytes']:>12,} bytes ({f['bytes_per_block']:.1f} per "
                f"block), encode {f['encode_ms']:.0f} ms, decode {f['decode_ms']:.0f} ms{versus}"
            )
    print(json.dumps({str(c): r for c, r in results.items()}))


if __name__ == "__main__":
    main()
