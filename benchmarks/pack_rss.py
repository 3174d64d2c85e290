"""What packing a transaction's log chunks holds in memory at most: the peak RSS the columnar
packing (`log_columns.columns_all`, one call for all of a transaction's chunks, as the writer
makes it) adds, beside the same chunks packed one call each (one chunk's work held at a time:
the floor).

    python benchmarks/pack_rss.py [--chunks N] [--seed S]

Each figure comes from a fresh interpreter (this file run as a child), its peak RSS reset once
the payloads are made (/proc/self/clear_refs), so that only the packing's own memory counts.
Both ways must give the same bytes: a digest of the frames is printed and compared. The last
line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream

from kvscope.storage import log_columns
from kvscope.storage.heap_trim import trim_heap
from kvscope.storage.log_chunks import MAX_CHUNK_BATCHES, MAX_CHUNK_RAW_BYTES

EVENTS_PER_CHUNK = 40_000
"""Block-events drawn per chunk wanted: enough for a full chunk (2 MiB) of the stream."""


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def runs_of(payloads: list[bytes], chunks: int) -> list[log_columns.Run]:
    """`chunks` runs of consecutive payloads, each as many as one chunk takes (its batch and
    byte bounds; the stream's time span is left out: the benchmark wants full chunks)."""
    runs: list[log_columns.Run] = []
    start = 0
    while len(runs) < chunks and start < len(payloads):
        end, size = start, 0
        while end < len(payloads) and end - start < MAX_CHUNK_BATCHES:
            if size + len(payloads[end]) > MAX_CHUNK_RAW_BYTES and end > start:
                break
            size += len(payloads[end])
            end += 1
        n = end - start
        stamps = array("d", (1000.0 + i / 64 for i in range(start, end)))
        runs.append(
            log_columns.Run(
                array("q", range(start, end)),
                stamps,
                stamps,
                payloads[start:end],
                log_columns.NO_GRANULES,
                True,
            )
        )
        assert n > 0
        start = end
    if len(runs) < chunks:
        raise SystemExit(f"the stream made {len(runs)} chunks, not {chunks}")
    return runs


def child(chunks: int, seed: int, together: bool) -> None:
    payloads, _ = make_stream(EVENTS_PER_CHUNK * chunks, seed, 100_000, 10**12)
    runs = runs_of(payloads, chunks)
    gc.collect()
    trim_heap()  # what making the payloads freed is not counted as room the packing reuses
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS (VmHWM) starts again from now
    before = _status_kib("VmRSS")
    if together:
        packed = log_columns.columns_all(runs)
    else:
        packed = [log_columns.columns_all([run])[0] for run in runs]
    peak = _status_kib("VmHWM")
    digest = hashlib.sha256()
    for frames, verbatim in packed:
        digest.update(repr(verbatim).encode())
        for frame in frames:
            digest.update(len(frame).to_bytes(8, "little") + frame)
    print(
        json.dumps(
            {
                "peak_delta_mib": round((peak - before) / 1024, 1),
                "payload_mib": round(sum(len(p) for r in runs for p in r.payloads) / 2**20, 1),
                "frame_mib": round(sum(len(f) for fr, _ in packed for f in fr) / 2**20, 1),
                "digest": digest.hexdigest(),
            }
        )
    )


def measure(chunks: int, seed: int, together: bool) -> dict[str, object]:
    command = [sys.executable, __file__, "--child", str(int(together))]
    command += ["--chunks", str(chunks), "--seed", str(seed)]
    run = subprocess.run(command, capture_output=True, text=True, check=False, env=os.environ)
    if run.returncode:
        raise SystemExit(run.stderr[-4000:])
    figures: dict[str, object] = json.loads(run.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=40, help="chunks in the one call")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--child", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.chunks, args.seed, bool(args.child))
        return
    apart = measure(args.chunks, args.seed, False)
    together = measure(args.chunks, args.seed, True)
    print(
        f"{args.chunks} chunks, {together['payload_mib']} MiB of payloads, "
        f"{together['frame_mib']} MiB of frames"
    )
    print(f"baseline: one call per chunk       peak RSS +{apart['peak_delta_mib']} MiB")
    print(f"one call for all (the writer's)    peak RSS +{together['peak_delta_mib']} MiB")
    same = apart["digest"] == together["digest"]
    print(f"same bytes both ways: {'yes' if same else 'NO'}")
    print(
        json.dumps(
            {
                "chunks": args.chunks,
                "apart_peak_delta_mib": apart["peak_delta_mib"],
                "together_peak_delta_mib": together["peak_delta_mib"],
                "frames_digest": together["digest"],
                "same_bytes": same,
            }
        )
    )
    if not same:
        raise SystemExit("the packing gave other bytes in one call than chunk by chunk")


if __name__ == "__main__":
    main()
