"""benchmarks/ingest.py's memory figure: resident bytes per cached block of a large map.

The map is built in a fresh interpreter (this file run as a script), so that nothing else the
benchmark made is counted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys

from _ingest_stream import BLOCK_SIZE, EPOCH, STEP_S, TOKEN_POOL, VOCAB

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import Batch, BlocksStored, StreamId
from kvscope.collector.wire import table_key

RSS_ROOT_P = 0.02
"""In the RSS map, the share of stores that start a new tree (parent None)."""
MASK64 = (1 << 64) - 1


# --- 4. memory per cached block ----------------------------------------------------------------
def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection, so distinct inputs give distinct hashes."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_child(blocks: int, seed: int) -> None:
    """In a fresh interpreter: build a map of `blocks` cached blocks, print RSS as JSON.

    Hashes come from a counter through a bijective mix, so choosing an existing parent keeps no
    list of hashes alive beside the map.
    """
    rng = random.Random(seed)
    pool = [[rng.randrange(VOCAB) for _ in range(BLOCK_SIZE)] for _ in range(TOKEN_POOL)]
    salt = (seed & 0xFFFF) << 40
    pmap = PrefixMap(StreamId("bench", 0))
    key = table_key("GPU", 0)
    gc.collect()
    before = _rss_bytes()
    count = seq = 0
    while count < blocks:
        n = min(rng.randint(1, 32), blocks - count)
        parent = None
        if count and rng.random() >= RSS_ROOT_P:
            parent = _mix64(salt + rng.randrange(count))
        hashes = [_mix64(salt + count + i) for i in range(n)]
        tokens: list[int] = []
        for block_hash in hashes:
            tokens += pool[block_hash % TOKEN_POOL]
        event = BlocksStored(hashes, parent, tokens, BLOCK_SIZE, key)
        pmap.apply(Batch(seq, EPOCH + seq * STEP_S, 0, [event]))
        count += n
        seq += 1
    del hashes, tokens, event
    gc.collect()
    after = _rss_bytes()
    totals = pmap.totals()
    print(json.dumps({"blocks": totals.blocks, "before": before, "after": after}))


def measure_rss(blocks: int, seed: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            str(blocks),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["blocks"] != blocks:
        raise RuntimeError(f"the RSS map holds {result['blocks']} blocks, not {blocks}")
    return float(result["after"] - result["before"]) / blocks


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rss_child(args.blocks, args.seed)
