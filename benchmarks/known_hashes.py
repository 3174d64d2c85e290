"""What a stream's known hashes cost the writer (storage/_log_known.pyx's `KnownHashes`, which
log chunk format 6 finds hash literals in): memory, build time and the split's cost per literal.

    python benchmarks/known_hashes.py [--sizes 100000,1000000] [--literals L] [--seed S]
                                      [--baseline-path PATH] [--no-instructions]

For each size (uniformly random 64-bit hashes, as an engine's block hashes are), it prints:
1. bytes per hash: resident memory a `KnownHashes` holds (its sorted list included), measured
   as the RSS that a few of them add in a fresh interpreter, the heap trimmed before each read;
2. build: the best of a few `KnownHashes(values)` calls from the sorted list (digest included);
3. split: `split_known` of `L` literals, half of them listed, in ns per literal (best of a few)
   and, with valgrind, in instructions per literal (callgrind, counting the calls alone).
Each figure comes from a child process running this file; with `--baseline-path`, the same
children run again with that PYTHONPATH ("" for the installed kvscope, e.g. main's build) and
both are printed side by side. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import starmap
from pathlib import Path

from _callgrind import collected, run_child, say_source, source

from kvscope.storage import _log_known
from kvscope.storage._hash_sort import sorted_hashes
from kvscope.storage._log_known import KnownHashes, split_known
from kvscope.storage.heap_trim import rss_bytes, trim_heap

HERE = Path(__file__).resolve()
ROUNDS = 5
SPLIT_CALLS = 3
"""`split_known` calls counted under callgrind (the figure is per literal of all of them)."""


def random_values(n: int, seed: int) -> bytes:
    """`n` distinct random hashes, sorted as `hashes_of` lists a checkpoint's."""
    values = sorted_hashes([array("Q", random.Random(seed).randbytes(8 * n))])
    assert len(values) == 8 * n, "two of the random hashes are one: another seed"
    return values


def literals(values: bytes, n: int, seed: int) -> bytes:
    """`n` 8-byte literals, half of them picked from `values`, shuffled."""
    rng = random.Random(seed + 1)
    count = len(values) // 8
    lits = [values[8 * k : 8 * k + 8] for k in rng.choices(range(count), k=n // 2)]
    lits += [rng.randbytes(8) for _ in range(n - n // 2)]
    rng.shuffle(lits)
    return b"".join(lits)


def bytes_per_hash(n: int, seed: int) -> float:
    """RSS that `KnownHashes` of `n` hashes add, per hash (several, so that pages count)."""
    copies = max(2, 1_000_000 // n)
    arrays: list[bytes | memoryview | array[int]] = [
        array("Q", random.Random(seed).randbytes(8 * n))
    ]
    trim_heap()
    before = rss_bytes() or 0
    held = [KnownHashes(sorted_hashes(arrays)) for _ in range(copies)]
    trim_heap()
    after = rss_bytes() or 0
    assert len(held) == copies
    return (after - before) / (copies * n)


def child(sizes: list[int], n_literals: int, seed: int) -> None:
    say_source(_log_known.__file__ or "?")
    out = {}
    for n in sizes:
        per_hash = bytes_per_hash(n, seed)
        values = random_values(n, seed)
        build = min(_timed(KnownHashes, values) for _ in range(ROUNDS))
        known = KnownHashes(values)
        lits = literals(values, n_literals, seed)
        split = min(_timed(split_known, lits, known) for _ in range(ROUNDS))
        found = split_known(lits, known)
        assert len(found[2]) == 8 * (n_literals - n_literals // 2), "a random literal listed?"
        out[n] = {
            "bytes_per_hash": round(per_hash, 2),
            "build_ms": round(build * 1e3, 3),
            "split_ns_per_literal": round(split * 1e9 / n_literals, 2),
        }
    print(json.dumps(out))


def _timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def count_child(n: int, n_literals: int, seed: int) -> None:
    """Under callgrind: the split's calls alone are counted (inside `deque_init`)."""
    say_source(_log_known.__file__ or "?")
    values = random_values(n, seed)
    known = KnownHashes(values)
    lits = literals(values, n_literals, seed)
    deque(starmap(split_known, [(lits, known)] * SPLIT_CALLS), maxlen=0)


@contextmanager
def _pythonpath(path: str | None) -> Iterator[None]:
    """Children started meanwhile run with PYTHONPATH `path` (None: this process's)."""
    saved = os.environ.get("PYTHONPATH")
    if path is not None:
        os.environ["PYTHONPATH"] = path
    try:
        yield
    finally:
        os.environ.pop("PYTHONPATH", None)
        if saved is not None:
            os.environ["PYTHONPATH"] = saved


def measure(args: argparse.Namespace, path: str | None) -> dict[str, dict[str, float]]:
    """Every figure, from children run with PYTHONPATH `path` (None: this one's)."""
    base = [sys.executable, str(HERE), "--seed", str(args.seed), "--literals", str(args.literals)]
    with _pythonpath(path):
        run = subprocess.run(
            [*base, "--child", "--sizes", args.sizes], capture_output=True, text=True, check=True
        )
    print(f"  kvscope from {source(run.stderr)}", file=sys.stderr)
    figures: dict[str, dict[str, float]] = json.loads(run.stdout.strip().splitlines()[-1])
    for n in figures if args.instructions else ():
        with _pythonpath(path), tempfile.TemporaryDirectory() as tmp:
            stderr = run_child([*base, "--count", n], f"{tmp}/split.out")
        calls = SPLIT_CALLS * args.literals
        figures[n]["split_instructions_per_literal"] = round(collected(stderr) / calls, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="hashes known, comma-separated")
    parser.add_argument("--literals", type=int, default=200_000, help="literals split per call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline-path", default=None, help='PYTHONPATH of a baseline build ("": installed)'
    )
    parser.add_argument("--no-instructions", dest="instructions", action="store_false")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(sizes, args.literals, args.seed)
        return
    if args.count:
        count_child(args.count, args.literals, args.seed)
        return
    if args.instructions and shutil.which("valgrind") is None:
        print("no valgrind: instructions not counted", file=sys.stderr)
        args.instructions = False
    print("this build:", file=sys.stderr)
    ours = measure(args, None)
    theirs = None
    if args.baseline_path is not None:
        print("baseline:", file=sys.stderr)
        theirs = measure(args, args.baseline_path)
    for n, figures in ours.items():
        print(f"{int(n):,} known hashes, {args.literals:,} literals (half listed):")
        for name, value in figures.items():
            line = f"  {name:<32} {value:>10,.2f}"
            if theirs is not None and name in theirs[n]:
                was = theirs[n][name]
                line += f"   baseline {was:>10,.2f}   ({value / was:.2f}x)"
            print(line)
    print(json.dumps({"this": ours, "baseline": theirs}))


if __name__ == "__main__":
    main()
