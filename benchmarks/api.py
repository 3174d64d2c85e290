"""API latency under load while ingest runs: POST /lookup over 100 replicas, and two GETs.

    python benchmarks/api.py [--replicas 100] [--rate 500] [--seconds 10]

A real uvicorn on loopback, started as `kvscope serve` starts it, serves `create_app` over a
collector of `--replicas` streams (their maps built from the bundled recording of vLLM's real
scheduler, each replica under its own name and at its own point of the recording) and a SQLite
store; a thread keeps feeding batches into the maps (each replica at the recording's pace, the
fleet out of step) while requests arrive open-loop at `--rate` per second from another process.
Lookups vary: each replica's longest cached prompt plus a new turn, in turn. Printed, each
beside the baseline of the same run (GET /healthz, the server's floor): p50 and p99 latency of
POST /lookup (target p99 <= 10 ms), GET /replicas/{replica} and GET /resets/{id}. The last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.block_table import BlockTable
from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector
from kvscope.demo_sources import bundled
from kvscope.serve import api_server
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter


def build(replicas: int, store: str) -> tuple[Collector, StoreWriter, list[list[CaptureRecord]]]:
    """The collector and, per replica, the records it has yet to receive."""
    records = list(read_capture(bundled("lab_3rps_180s.msgpack.gz")))
    streams = [s for i in range(replicas) for s in replica_streams(f"r{i}", "tcp://127.0.0.1:9")]
    writer = StoreWriter(open_store(store), StoreSettings(queue_rows=10_000_000))
    # The collector is never started: its maps are fed directly, through the same ingest code.
    collector = Collector(streams, sink=writer)
    # Each replica at its own point of the recording (a third to two thirds in), as a fleet's
    # replicas are: in lockstep, all of them would checkpoint in the same millisecond.
    third, rests = len(records) // 3, []
    for i, ingest in enumerate(collector.ingests.values()):
        warm = third + third * i // replicas
        for r in records[:warm]:
            ingest.live_frames(r.frames, r.recv_ts)
        rests.append(records[warm:])
    return collector, writer, rests


BATCHES_PER_S = 12.0
"""Per replica: the recording's pace (vLLM's scheduler at 3 req/s publishes ~12 batches/s)."""


def longest_cached_prompt(table: BlockTable) -> list[int]:
    """The tokens of the table's longest cached chain: a prompt that hits all the way."""
    tree = max((t for t in table.subtrees() if not t.orphan), key=lambda t: max(t.leaf_depths))
    chain, block = [], table.parent_of(tree.deepest_leaf)
    chain.append(tree.deepest_leaf)
    while block is not None and block in table:
        chain.append(block)
        block = table.parent_of(block)
    return [t for b in reversed(chain) for t in table.entry(b).token_ids or ()]


def prompts(collector: Collector, count: int) -> list[list[int]]:
    """Lookups that vary as a router's do: the longest cached prompt of each of `count`
    replicas, each followed by a new turn of 1 to 40 tokens (up to two blocks that hit
    nowhere). Each hits deep on some replicas and shallow or not at all on others."""
    rng = random.Random(4)
    found = []
    for ingest in list(collector.ingests.values())[:count]:
        tables = [t for t in ingest.map.tables.values() if t.hittable_count]
        if tables:
            turn = [rng.randrange(32_000) for _ in range(rng.randrange(1, 41))]
            found.append(longest_cached_prompt(tables[0]) + turn)
    return found


PHASES = 12
"""Replicas publish out of step: each batch period, the fleet's batches arrive in this many
waves (as the collector's poll loop finds a few sockets ready at a time), not all at once."""


def feed(collector: Collector, rests: list[list[CaptureRecord]], stop: threading.Event) -> int:
    """Ingest while the API is loaded: every replica at the recording's pace, so the collector
    works as it would for a fleet this size."""
    applied = 0
    fleet = list(zip(collector.ingests.values(), rests, strict=True))
    waves = [fleet[phase::PHASES] for phase in range(PHASES)]
    start = time.monotonic()
    for i in range(max(len(rest) for rest in rests)):
        for phase, wave in enumerate(waves):
            due = start + (i + phase / PHASES) / BATCHES_PER_S
            while (wait := due - time.monotonic()) > 0:
                if stop.wait(min(wait, 0.05)):
                    return applied
            for ingest, rest in wave:
                if i < len(rest):
                    with collector.lock:
                        ingest.live_frames(rest[i].frames, rest[i].recv_ts)
                    applied += 1
    return applied


async def load(
    port: int, method: str, path: str, bodies: list[object], rate: float, seconds: float
) -> list[float]:
    """Open-loop: a request every 1/rate s whatever the answers, each body in turn; latencies in
    ms.

    A bare HTTP/1.1 client over asyncio streams (a pool of keep-alive connections): a Python
    HTTP library would spend more CPU than the server it measures on a small machine.
    """
    requests = []
    for body in bodies:
        payload = b"" if body is None else json.dumps(body).encode()
        requests.append(
            (
                f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
            ).encode()
            + payload
        )
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(64):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []

    async def one(due: float, request: bytes) -> None:
        reader, writer = await idle.get()
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        # From when the request was due: queueing for a free connection counts too.
        latencies.append((time.perf_counter() - due) * 1000)
        idle.put_nowait((reader, writer))
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}")

    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, requests[i % len(requests)])))
    await asyncio.gather(*tasks)
    return latencies


def run_load(
    port: int, method: str, path: str, bodies: list[object], rate: float, seconds: float
) -> list[float]:
    return asyncio.run(load(port, method, path, bodies, rate, seconds))


def pcts(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=18087)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        collector, writer, rests = build(args.replicas, f"sqlite:///{Path(tmp) / 'b.sqlite'}")
        writer.flush(120)
        app = create_app(ApiData(collector, writer.engine, writer), ApiSettings())
        server = api_server(app, "127.0.0.1", args.port)  # as `kvscope serve` runs it
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{args.port}"
        no_body: list[object] = [None]
        lookups: list[object] = [{"token_ids": p} for p in prompts(collector, 16)]
        reset_id = httpx.get(url + "/resets").json()[0]["id"]

        stop = threading.Event()
        fed: list[int] = []
        feeder = threading.Thread(target=lambda: fed.append(feed(collector, rests, stop)))
        feeder.start()
        results = {}
        for name, method, path, bodies, rate in (
            ("healthz (baseline)", "GET", "/healthz", no_body, args.rate),
            ("POST /lookup", "POST", "/lookup", lookups, args.rate),
            ("GET /replicas/{replica}", "GET", "/replicas/r7", no_body, args.rate / 5),
            ("GET /resets/{id}", "GET", f"/resets/{reset_id}", no_body, args.rate / 5),
        ):
            # One request first, not measured: a route's first call builds what it caches.
            httpx.request(method, url + path, json=bodies[0], timeout=30).raise_for_status()
            # The load comes from another process: it must not share the server's GIL.
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                latencies = pool.submit(
                    run_load, args.port, method, path, bodies, rate, args.seconds
                ).result()
            results[name] = pcts(latencies)
            p50, p99 = results[name]
            print(f"{name:28s} {rate:6.0f} req/s   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")
        stop.set()
        feeder.join()
        server.should_exit = True
        thread.join(10)
        writer.close()
    print(f"ingest during the run: {fed[0] if fed else 0} batches into {args.replicas} replicas")
    base = results["healthz (baseline)"]
    print(
        f"POST /lookup p99 {results['POST /lookup'][1]:.2f} ms  "
        f"(target <= 10 ms; baseline p99 {base[1]:.2f} ms)"
    )
    print(
        json.dumps(
            {
                "replicas": args.replicas,
                "rate": args.rate,
                "baseline_p50_ms": round(base[0], 2),
                "baseline_p99_ms": round(base[1], 2),
                "lookup_p50_ms": round(results["POST /lookup"][0], 2),
                "lookup_p99_ms": round(results["POST /lookup"][1], 2),
                "replica_p50_ms": round(results["GET /replicas/{replica}"][0], 2),
                "replica_p99_ms": round(results["GET /replicas/{replica}"][1], 2),
                "reset_p50_ms": round(results["GET /resets/{id}"][0], 2),
                "reset_p99_ms": round(results["GET /resets/{id}"][1], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
