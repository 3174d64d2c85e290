"""Issue 12's fuzz harness, for long runs: hostile frames through live sockets into `kvscope serve`.

    .venv/bin/python scripts/fuzz.py --frames 100000 --seed 1 [--rate 0] [--until-last-clear]

Starts `kvscope serve` with two replicas (`honest`, `hostile`) on XPUB sockets bound here,
plays the bundled capture on both, with `--frames` hostile messages interleaved into `hostile`,
then checks the process, the API and both maps (kvscope/fuzz/live.py). Prints a summary; exits 1
on any failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvscope.fuzz.checks import summary
from kvscope.fuzz.live import BUNDLED, FuzzOptions, run_fuzz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=10_000, help="hostile messages to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="hostile messages/s; 0: no limit")
    parser.add_argument(
        "--until-last-clear",
        action="store_true",
        help="only before the capture's last clear: the hostile map must end exact",
    )
    parser.add_argument(
        "--no-wide-seqs",
        action="store_true",
        help="no seq jumps to 2**63 and 2**64-1 (to look past the store's failure on them)",
    )
    parser.add_argument("--classes", default="", help="comma-separated classes (default: all)")
    parser.add_argument("--window", type=int, default=2_000, help="messages between two syncs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--capture", type=Path, default=BUNDLED)
    parser.add_argument("--workdir", type=Path, help="keep serve's log and store here")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the store")
    parser.add_argument("--max-rss-growth-mib", type=float, help="fail past this RSS growth")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    options = FuzzOptions(
        frames=args.frames,
        seed=args.seed,
        rate=args.rate,
        until_last_clear=args.until_last_clear,
        wide_seqs=not args.no_wide_seqs,
        classes=tuple(c for c in args.classes.split(",") if c),
        window=args.window,
        timeout_s=args.timeout,
        capture=args.capture,
        workdir=args.workdir,
        max_rss_growth_mib=args.max_rss_growth_mib,
        drain_s=args.drain,
        log=lambda line: print(line, flush=True),
    )
    result = run_fuzz(options)
    print(summary(result), flush=True)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
