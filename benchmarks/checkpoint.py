"""What a checkpoint costs: its size, and the time to encode and decode it, in each format.

    python benchmarks/checkpoint.py [--cached C ...] [--seed S] [--repeats R]

For a map of about C cached blocks (benchmarks/ingest.py's stream applied in memory), each
snapshot format the store reads is encoded and decoded `--repeats` times, back to back, and
printed beside the format before it (the baseline, measured in the same run): bytes, bytes per
cached block, and the median encode and decode times. Every decoded map is checked against the
map encoded. The last line is one JSON object with those figures.
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
from kvscope.collector.snapshot import SNAPSHOT_FORMATS, decode_map, encode_map
from kvscope.collector.types import StreamId
from kvscope.collector.wire import BatchDecoder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream

STREAM = StreamId("bench", 0)


def full_map(cached: int, seed: int) -> PrefixMap:
    """The map once the cache has filled and turned over (benchmarks/store.py's stream)."""
    payloads, _ = make_stream(4 * cached, seed, cached, 10**12)
    prefix_map, decode = PrefixMap(STREAM), BatchDecoder().decode
    for seq, payload in enumerate(payloads):
        prefix_map.apply(decode(payload, seq))
    return prefix_map


def _median_ms(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, result


def measure(prefix_map: PrefixMap, repeats: int) -> dict[int, dict[str, float]]:
    blocks = prefix_map.totals().blocks
    counts = prefix_map.counts()
    figures = {}
    for version in SNAPSHOT_FORMATS:
        encode_ms, data = _median_ms(partial(encode_map, prefix_map, version=version), repeats)
        assert isinstance(data, bytes)
        decode_ms, back = _median_ms(partial(decode_map, data, STREAM), repeats)
        assert isinstance(back, PrefixMap) and back.counts() == counts
        figures[version] = {
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
        prefix_map = full_map(cached, args.seed)
        figures = results[cached] = measure(prefix_map, args.repeats)
        print(f"a map of {prefix_map.totals().blocks:,} cached blocks:")
        for version, f in figures.items():
            base = figures.get(version - 1)
            versus = (
                ""
                if base is None
                else f"  (format {version - 1}: {base['bytes']:,} bytes, encode "
                f"{base['encode_ms']:.0f} ms, decode {base['decode_ms']:.0f} ms)"
            )
            print(
                f"  format {version}: {f['bytes']:>12,} bytes ({f['bytes_per_block']:.1f} per "
                f"block), encode {f['encode_ms']:.0f} ms, decode {f['decode_ms']:.0f} ms{versus}"
            )
    print(json.dumps({str(c): {str(v): f for v, f in r.items()} for c, r in results.items()}))


if __name__ == "__main__":
    main()
