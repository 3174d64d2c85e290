"""What hostile input costs `kvscope serve` in memory, beside the same run without it.

    python benchmarks/hostile.py [--frames 20000] [--seed 1]

Two runs of issue 12's fuzz harness (kvscope/fuzz/live.py: `kvscope serve` in its own process,
two replicas on real sockets, the bundled recording of vLLM's real scheduler played on both):
the baseline sends no hostile message; the second interleaves `--frames` hostile ones (every
class: malformed payloads, huge sizes, nesting, wide and backward seqs, extra frames...) into
one replica. Printed for each: serve's RSS before publishing, after, its peak, and once the
store's queue has emptied, then the hostile run's growth beside the baseline's. The last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvscope.fuzz.live import FuzzOptions, FuzzResult, run_fuzz

MIB = 1024.0


@dataclass(frozen=True)
class Memory:
    before_mib: float
    after_mib: float
    peak_mib: float
    drained_mib: float | None
    hostile_messages: int
    hostile_mib: float
    passed: bool

    @property
    def growth_mib(self) -> float:
        return self.after_mib - self.before_mib

    @classmethod
    def of(cls, result: FuzzResult) -> Memory:
        before, after, peak = result.rss_kib
        return cls(
            before_mib=before / MIB,
            after_mib=after / MIB,
            peak_mib=peak / MIB,
            drained_mib=None if result.drained is None else result.drained[1] / MIB,
            hostile_messages=sum(result.tally.sent.values()),
            hostile_mib=result.tally.hostile_bytes / (MIB * MIB),
            passed=not result.failures,
        )


def measure(frames: int, seed: int, workdir: Path) -> Memory:
    workdir.mkdir(parents=True, exist_ok=True)
    options = FuzzOptions(frames=frames, seed=seed, workdir=workdir, log=lambda _line: None)
    result = run_fuzz(options)
    for failure in result.failures:
        print(f"  check failed ({frames} hostile): {failure}", file=sys.stderr)
    return Memory.of(result)


def _line(name: str, m: Memory) -> str:
    drained = "-" if m.drained_mib is None else f"{m.drained_mib:7.1f}"
    return (
        f"{name:<10} {m.hostile_messages:>9} {m.hostile_mib:>9.1f} {m.before_mib:>8.1f} "
        f"{m.after_mib:>8.1f} {m.growth_mib:>+8.1f} {m.peak_mib:>8.1f} {drained:>8} "
        f"{'PASS' if m.passed else 'FAIL':>5}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20_000, help="hostile messages")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvscope-hostile-") as tmp:
        baseline = measure(0, args.seed, Path(tmp) / "baseline")
        hostile = measure(args.frames, args.seed, Path(tmp) / "hostile")
    print(
        f"{'run':<10} {'hostile':>9} {'MiB sent':>9} {'RSS0':>8} {'RSS1':>8} {'growth':>8} "
        f"{'peak':>8} {'drained':>8} {'check':>5}   (MiB)"
    )
    print(_line("baseline", baseline))
    print(_line("hostile", hostile))
    extra = hostile.growth_mib - baseline.growth_mib
    print(f"hostile input's own growth: {extra:+.1f} MiB for {hostile.hostile_mib:.1f} MiB sent")
    print(
        json.dumps(
            {"baseline": baseline.__dict__, "hostile": hostile.__dict__, "extra_growth_mib": extra}
        )
    )
    return 0 if baseline.passed and hostile.passed else 1


if __name__ == "__main__":
    sys.exit(main())
