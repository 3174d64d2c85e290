"""A PostgreSQL outage at a fleet's rate: what the store's queue holds, spills, drops and keeps.

    python benchmarks/outage.py [--replicas 100] [--rate 2500] [--outage-s 120] [--seed 1]

`--replicas` streams, each `--rate` block-events a second (an H200 prefilling ~20k tokens/s),
go through one `StoreWriter` into a fresh PostgreSQL database reached through a TCP relay. The
outage run cuts the relay (connections dropped, new ones closed at once: the server is gone for
kvscope while it stays up for everyone else) and feeds `--outage-s` seconds' worth of every
stream, then restores it and times the drain. The baseline run feeds
the same batches with the store up. Printed for each: peak RSS and bytes in the queue's memory
and spill, batches dropped, resets kept, the time to drain, and RSS once drained. Then checks:
every batch is in the store or inside an `incomplete` interval, and every reset is kept.
The last line is one JSON object.

The stream is benchmarks/ingest.py's model of vLLM's BlockPool; all replicas play the same
batches (their maps and seqs are their own), fed at `--rate` (`--fast`: as fast as ingest
goes). What the queue holds, spills and drops during the outage depends on bytes and rows, not
on time; whether the store keeps up in the baseline depends on this machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import func, make_url, select

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.heap_trim import rss_bytes
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream
from _pg import PG_ADMIN, fresh_database

MIB = float(1 << 20)


class CuttableRelay:
    """A TCP relay to one server that can be cut and restored."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.down = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self._lock:
                self._pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.down = True
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def restore(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self._listener.close()


@dataclass(frozen=True)
class Run:
    outage: bool
    block_events: int
    payload_mib: float
    feed_s: float
    drain_s: float
    rss_before_mib: float
    rss_peak_mib: float
    rss_drained_mib: float
    queue_peak_mib: float
    spill_peak_mib: float
    batches_dropped: int
    resets_sent: int
    resets_kept: int
    batches_kept: int
    incomplete_intervals: int
    unaccounted_batches: int
    """Batches neither in the store nor inside an incomplete interval: must be 0."""


def _mib(n: int | None) -> float:
    return 0.0 if n is None else n / MIB


def measure(
    payloads: list[bytes], block_events: int, replicas: int, outage: bool, span_s: float
) -> Run:
    """One run; the batches are fed over `span_s` seconds (0: as fast as ingest goes)."""
    admin = make_url(PG_ADMIN)
    relay = CuttableRelay(admin.host or "127.0.0.1", admin.port or 5432)
    streams = [StreamId(f"replica-{i:03d}", 0) for i in range(replicas)]
    with (
        fresh_database("kvscope_outage_") as name,
        tempfile.TemporaryDirectory(prefix="kvscope-spill-") as spill,
    ):
        url = admin.set(host="127.0.0.1", port=relay.port, database=name)
        engine = open_store(url.render_as_string(hide_password=False))
        # Defaults but the retry's cap: the drain time should not be mostly backoff.
        writer = StoreWriter(engine, StoreSettings(spill_dir=spill, retry_max_s=1.0))
        ingests = [StreamIngest(s, can_replay=False, sink=writer) for s in streams]
        peaks = Peaks(rss_bytes() or 0)
        rss_before = peaks.rss
        if outage:
            relay.cut()
        started = time.perf_counter()
        step_s = span_s / len(payloads)
        for seq, payload in enumerate(payloads):
            ahead = started + seq * step_s - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            frames = [b"", seq.to_bytes(8, "big"), payload]
            now = time.time()
            for ingest in ingests:
                ingest.live_frames(frames, now)
            if seq % 256 == 0:
                peaks.sample(writer)
        feed_s = time.perf_counter() - started
        peaks.sample(writer)
        relay.restore()
        started = time.perf_counter()
        while not writer.flush(1.0):
            peaks.sample(writer)
        drain_s = time.perf_counter() - started
        rss_drained = rss_bytes() or 0
        dropped = writer.stats.batches_dropped
        resets_sent = sum(i.map.counters.clears for i in ingests)
        writer.close(600)
        iv = schema.intervals.c
        with engine.connect() as conn:
            kept = batch_log.count_batches(conn)
            resets = conn.execute(select(func.count()).select_from(schema.resets)).scalar_one()
            holes, in_holes = conn.execute(
                select(func.count(), func.coalesce(func.sum(iv.to_seq - iv.from_seq + 1), 0)).where(
                    iv.kind == "incomplete"
                )
            ).one()
        engine.dispose()
    relay.close()
    return Run(
        outage=outage,
        block_events=block_events * replicas,
        payload_mib=sum(map(len, payloads)) * replicas / MIB,
        feed_s=feed_s,
        drain_s=drain_s,
        rss_before_mib=_mib(rss_before),
        rss_peak_mib=_mib(peaks.rss),
        rss_drained_mib=_mib(rss_drained),
        queue_peak_mib=_mib(peaks.queue),
        spill_peak_mib=_mib(peaks.spill),
        batches_dropped=dropped,
        resets_sent=resets_sent,
        resets_kept=int(resets),
        batches_kept=kept,
        incomplete_intervals=int(holes),
        unaccounted_batches=len(payloads) * replicas - kept - int(in_holes),
    )


@dataclass
class Peaks:
    rss: int
    queue: int = 0
    spill: int = 0

    def sample(self, writer: StoreWriter) -> None:
        self.rss = max(self.rss, rss_bytes() or 0)
        self.queue = max(self.queue, writer.memory_bytes)
        self.spill = max(self.spill, writer.spill_bytes)


def _line(r: Run) -> str:
    return (
        f"{'outage' if r.outage else 'baseline':<9} {r.feed_s:>7.1f} {r.drain_s:>7.1f} "
        f"{r.rss_before_mib:>7.0f} {r.rss_peak_mib:>7.0f} {r.rss_drained_mib:>7.0f} "
        f"{r.queue_peak_mib:>7.0f} {r.spill_peak_mib:>7.0f} {r.batches_dropped:>9,} "
        f"{r.resets_kept:>4}/{r.resets_sent:<4} {r.incomplete_intervals:>6}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--rate", type=int, default=2_500, help="block-events/s per replica")
    parser.add_argument("--outage-s", type=float, default=120.0)
    parser.add_argument("--cached", type=int, default=20_000, help="blocks cached per replica")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fast", action="store_true", help="feed as fast as ingest goes, not at --rate"
    )
    parser.add_argument("--no-baseline", action="store_true", help="only the outage run")
    args = parser.parse_args(argv)
    per_replica = int(args.rate * args.outage_s)
    # A reset every 40 s of each replica's stream: resets happen during the outage too.
    payloads, stats = make_stream(per_replica, args.seed, args.cached, args.rate * 40)
    print(
        f"stream: {args.replicas} replicas x {stats.block_events:,} block-events "
        f"({args.outage_s:.0f} s at {args.rate:,}/s) in {len(payloads):,} batches each, "
        f"{sum(map(len, payloads)) * args.replicas / MIB:,.0f} MiB of payloads"
    )
    print(
        f"{'run':<9} {'feed s':>7} {'drain s':>7} {'RSS0':>7} {'peak':>7} {'drained':>7} "
        f"{'queue':>7} {'spill':>7} {'dropped':>9} {'resets':>9} {'holes':>6}   (MiB)"
    )
    runs = []
    for outage in (True,) if args.no_baseline else (False, True):
        span_s = 0.0 if args.fast else args.outage_s
        run = measure(payloads, stats.block_events, args.replicas, outage, span_s)
        print(_line(run), flush=True)
        runs.append(run)
    failed = [
        f"{'outage' if r.outage else 'baseline'}: {what}"
        for r in runs
        for what, bad in (
            (f"{r.unaccounted_batches} batches neither stored nor marked", r.unaccounted_batches),
            (f"{r.resets_sent - r.resets_kept} resets lost", r.resets_kept != r.resets_sent),
        )
        if bad
    ]
    for line in failed:
        print(f"  check failed: {line}", file=sys.stderr)
    print(json.dumps({"runs": [asdict(r) for r in runs], "passed": not failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
