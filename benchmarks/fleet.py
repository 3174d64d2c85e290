"""How many replicas one collector follows: a fleet in connect mode at an H200's rate, store on.

    python benchmarks/fleet.py [--stores none,sqlite,postgresql] [--rate 2500] [--start 4]
                               [--max 1024] [--duration 10] [--warmup 3] [--procs 2]
                               [--reset-every 40] [--replicas N] [--json]

Each trial runs N publishers (benchmarks/_fleet_publishers.py: a few processes, each driving
many PUB sockets that connect to the collector's bound SUB with llm-d topics
`kv@<ip>:<port>@model`, each at `--rate` block-events/s with paced sends, real seqs and a replay
ROUTER) into one collector in bind mode (`Collector` with `FleetSettings`, as
`kvscope collect --bind` runs it) with the store on (a fresh SQLite file; a fresh PostgreSQL
database), or off (`none`: the baseline). Per trial (benchmarks/_fleet_trial.py):
- lag: from a batch's send time (its `ts`) to its application to the map, p50/p99/max over the
  batches sent after `--warmup` (an application is seen by a thread that samples each stream's
  last applied seq every 10 ms, outside the collector's path: a lag is at most 10 ms long);
- lost: batches sent and never applied, dropped by the store, or in a gap left degraded;
- drain: the time the store takes to write its backlog once sending stops;
- CPU: the collector process's CPU seconds per second (loop, store writer and ZMQ threads; not
  the sampler's) over the measured span, per replica, and replicas per core;
- store bytes per replica-hour: the store's growth over the run.
A trial keeps up when lag p99 <= 1 s, nothing is lost and the drain takes <= 1 s. For each
store, N doubles from `--start` until a trial fails, then is bisected (to `--resolution`): the
most replicas that kept up. `--replicas N` runs that one trial per store instead.

The stream is benchmarks/ingest.py's model of vLLM's BlockPool (every replica plays the same
batches, each from seq 0 at its own phase), with a reset (AllBlocksCleared) every
`--reset-every` seconds of a replica's stream: each reset's recovery and prefix groups are
stored as it recovers, a cost per reset. The figures depend on the machine: the publishers
share its cores with the collector, and a loaded machine makes lag that is not the collector's.
The last line (`--json`: the only output) is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fleet_publishers import Stream
from _fleet_trial import STORES, Trial, run_trial
from _ingest_stream import VllmBlockRemoved, VllmBlockStored, VllmEventBatch, make_stream

HEADER = (
    f"{'store':<11} {'N':>5} {'p50 s':>6} {'p99 s':>6} {'max s':>6} {'lost':>5} {'drain':>6} "
    f"{'cores':>6} {'N/core':>7} {'MB/rep-h':>9}  kept up"
)


def fleet_stream(rate: float, seconds: float, seed: int, reset_every_s: float) -> Stream:
    """`seconds` of one replica's batches at `rate`, with each batch's place in block-events."""
    payloads, _ = make_stream(int(rate * seconds) + 1, seed, 20_000, int(rate * reset_every_s))
    decode = msgspec.msgpack.Decoder(VllmEventBatch).decode
    cum, total = [], 0
    for payload in payloads:
        cum.append(total)
        for event in decode(payload).events:
            if isinstance(event, VllmBlockStored | VllmBlockRemoved):
                total += len(event.block_hashes)
    return Stream(payloads, cum, rate)


def line(t: Trial) -> str:
    return (
        f"{t.store:<11} {t.replicas:>5} {t.lag_p50_s:>6.3f} {t.lag_p99_s:>6.3f} "
        f"{t.lag_max_s:>6.2f} {t.lost:>5} {t.drain_s:>6.2f} {t.cpu_cores:>6.2f} "
        f"{t.replicas_per_core:>7.1f} {t.store_bytes_per_replica_hour / 1e6:>9.1f}  "
        f"{'yes' if t.kept_up else 'no'}"
    )


def search(store: str, args: argparse.Namespace, stream: Stream, quiet: bool) -> list[Trial]:
    """Trials for one store: N doubled from `--start` until one fails, then bisected."""

    def trial(n: int) -> Trial:
        t = run_trial(store, n, stream, args.seed, args.procs, args.warmup, args.duration)
        if not quiet:
            print(line(t), flush=True)
        return t

    if args.replicas:
        return [trial(args.replicas)]
    trials = [trial(args.start)]
    while trials[-1].kept_up and trials[-1].replicas * 2 <= args.max:
        trials.append(trial(trials[-1].replicas * 2))
    good = max((t.replicas for t in trials if t.kept_up), default=0)
    bad = min((t.replicas for t in trials if not t.kept_up), default=0)
    while good and bad and bad - good > max(1, int(good * args.resolution)):
        t = trial((good + bad) // 2)
        trials.append(t)
        good, bad = (t.replicas, bad) if t.kept_up else (good, t.replicas)
    return trials


def best(trials: list[Trial]) -> Trial | None:
    kept = [t for t in trials if t.kept_up]
    return max(kept, key=lambda t: t.replicas) if kept else None


def summary_line(store: str, top: Trial | None, baseline: Trial | None) -> str:
    """One store's figures, each beside the baseline's (the store off) from the same run."""
    if top is None:
        return f"  {store:<11} none kept up"
    base = baseline if baseline is not None and store != "none" else None

    def beside(figure: Callable[[Trial], float], fmt: str) -> str:
        assert top is not None
        mine = f"{figure(top):{fmt}}"
        return mine if base is None else f"{mine} (none: {figure(base):{fmt}})"

    return (
        f"  {store:<11} replicas {beside(lambda t: t.replicas, 'd')}"
        f"  lag p99 {beside(lambda t: t.lag_p99_s, '.3f')} s"
        f"  CPU/replica {beside(lambda t: t.cpu_per_replica * 1e3, '.1f')} ms/s"
        f"  replicas/core {beside(lambda t: t.replicas_per_core, '.0f')}"
        f"  store {top.store_bytes_per_replica_hour / 1e6:.1f} MB/replica-hour"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated, of: " + ", ".join(STORES)
    )
    parser.add_argument("--rate", type=float, default=2_500, help="block-events/s per replica")
    parser.add_argument("--start", type=int, default=4, help="replicas of the first trial")
    parser.add_argument("--max", type=int, default=1024, help="replicas tried at most")
    parser.add_argument("--resolution", type=float, default=0.1, help="bisect to this share of N")
    parser.add_argument(
        "--replicas", type=int, default=0, help="one trial of N per store, no search"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per trial")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--procs", type=int, default=2, help="publisher processes")
    parser.add_argument(
        "--reset-every", type=float, default=40.0, help="seconds between a replica's resets"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    unknown = set(stores) - set(STORES)
    if unknown:
        parser.error(f"unknown store {', '.join(sorted(unknown))}: one of {', '.join(STORES)}")
    stream = fleet_stream(args.rate, args.warmup + args.duration + 5, args.seed, args.reset_every)
    if not args.json:
        print(
            f"stream: {args.rate:,.0f} block-events/s per replica, {len(stream.payloads):,} "
            f"batches of {sum(map(len, stream.payloads)) / len(stream.payloads):,.0f} B on average"
        )
        print(HEADER)
    found = {store: search(store, args, stream, args.json) for store in stores}
    if not args.json:
        print("most replicas kept up (lag p99 <= 1 s, nothing lost, store drained <= 1 s):")
        baseline = best(found.get("none", []))
        for store, trials in found.items():
            print(summary_line(store, best(trials), baseline))
    tops = {store: best(trials) for store, trials in found.items()}
    summary = {
        store: {
            "best": None if (top := tops[store]) is None else asdict(top),
            "trials": [asdict(t) for t in trials],
        }
        for store, trials in found.items()
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
