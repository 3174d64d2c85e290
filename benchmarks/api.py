"""API latency under load while ingest runs: POST /lookup over 100 replicas, and two GETs.

    python benchmarks/api.py [--replicas 100] [--rate 500] [--seconds 10]

A real uvicorn on loopback serves `create_app` over a collector of `--replicas` streams (their
maps built from the bundled recording of vLLM's real scheduler, each replica under its own
name) and a SQLite store; a thread keeps feeding batches into the maps while requests arrive
open-loop at `--rate` per second. Printed, each beside the baseline of the same run (GET
/healthz, the server's floor): p50 and p99 latency of POST /lookup (target p99 <= 10 ms),
GET /replicas/{replica} and GET /resets/{id}. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import uvicorn

from kvscope.api.app import create_app
from kvscope.api.context import ApiSettings
from kvscope.api.data import ApiData
from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.subscriber import Collector
from kvscope.demo import _bundled
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreSettings, StoreWriter


def build(replicas: int, store: str) -> tuple[Collector, StoreWriter, list[CaptureRecord]]:
    records = list(read_capture(_bundled("lab_3rps_180s.msgpack.gz")))
    streams = [s for i in range(replicas) for s in replica_streams(f"r{i}", "tcp://127.0.0.1:9")]
    writer = StoreWriter(open_store(store), StoreSettings(queue_rows=10_000_000))
    # The collector is never started: its maps are fed directly, through the same ingest code.
    collector = Collector(streams, listeners=[writer], observers=[writer.after_batch],
                          pre_apply=[writer.before_batch])  # fmt: skip
    warm = len(records) * 2 // 3
    for ingest in collector.ingests.values():
        for r in records[:warm]:
            ingest.live_frames(r.frames, r.recv_ts)
    return collector, writer, records[warm:]


BATCHES_PER_S = 12.0
"""Per replica: the recording's pace (vLLM's scheduler at 3 req/s publishes ~12 batches/s)."""


def longest_cached_prompt(collector: Collector) -> list[int]:
    """The tokens of the longest cached chain of one replica: a prompt that hits everywhere."""
    ingest = next(iter(collector.ingests.values()))
    table = ingest.map.tables[next(iter(ingest.map.tables))]
    tree = max((t for t in table.subtrees() if not t.orphan), key=lambda t: max(t.leaf_depths))
    chain, block = [], table.parent_of(tree.deepest_leaf)
    chain.append(tree.deepest_leaf)
    while block is not None and block in table:
        chain.append(block)
        block = table.parent_of(block)
    return [t for b in reversed(chain) for t in table.entry(b).token_ids or ()]


def feed(collector: Collector, rest: list[CaptureRecord], stop: threading.Event) -> int:
    """Ingest while the API is loaded: every replica at the recording's pace, so the collector
    works as it would for a fleet this size."""
    applied = 0
    ingests = list(collector.ingests.values())
    start = time.monotonic()
    for i, r in enumerate(rest):
        while (wait := start + i / BATCHES_PER_S - time.monotonic()) > 0:
            if stop.wait(min(wait, 0.05)):
                return applied
        for ingest in ingests:
            if stop.is_set():
                return applied
            with collector.lock:
                ingest.live_frames(r.frames, r.recv_ts)
            applied += 1
    return applied


async def load(
    port: int, method: str, path: str, body: object, rate: float, seconds: float
) -> list[float]:
    """Open-loop: a request every 1/rate s whatever the answers; latencies in ms.

    A bare HTTP/1.1 client over asyncio streams (a pool of keep-alive connections): a Python
    HTTP library would spend more CPU than the server it measures on a small machine.
    """
    payload = b"" if body is None else json.dumps(body).encode()
    request = (
        f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(64):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []

    async def one(due: float) -> None:
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
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    return latencies


def run_load(
    port: int, method: str, path: str, body: object, rate: float, seconds: float
) -> list[float]:
    return asyncio.run(load(port, method, path, body, rate, seconds))


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
        collector, writer, rest = build(args.replicas, f"sqlite:///{Path(tmp) / 'b.sqlite'}")
        writer.flush(120)
        app = create_app(ApiData(collector, writer.engine, writer), ApiSettings())
        server = uvicorn.Server(
            uvicorn.Config(
                app, port=args.port, log_level="warning", access_log=False,
                http="httptools", loop="uvloop",
            )
        )  # fmt: skip
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{args.port}"
        tokens = longest_cached_prompt(collector)
        reset_id = httpx.get(url + "/resets").json()[0]["id"]

        stop = threading.Event()
        fed: list[int] = []
        feeder = threading.Thread(target=lambda: fed.append(feed(collector, rest, stop)))
        feeder.start()
        results = {}
        for name, method, path, body, rate in (
            ("healthz (baseline)", "GET", "/healthz", None, args.rate),
            ("POST /lookup", "POST", "/lookup", {"token_ids": tokens}, args.rate),
            ("GET /replicas/{replica}", "GET", "/replicas/r7", None, args.rate / 5),
            ("GET /resets/{id}", "GET", f"/resets/{reset_id}", None, args.rate / 5),
        ):
            # The load comes from another process: it must not share the server's GIL.
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                latencies = pool.submit(
                    run_load, args.port, method, path, body, rate, args.seconds
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
    print(json.dumps({
        "replicas": args.replicas, "rate": args.rate,
        "baseline_p50_ms": round(base[0], 2), "baseline_p99_ms": round(base[1], 2),
        "lookup_p50_ms": round(results["POST /lookup"][0], 2),
        "lookup_p99_ms": round(results["POST /lookup"][1], 2),
        "replica_p50_ms": round(results["GET /replicas/{replica}"][0], 2),
        "replica_p99_ms": round(results["GET /replicas/{replica}"][1], 2),
        "reset_p50_ms": round(results["GET /resets/{id}"][0], 2),
        "reset_p99_ms": round(results["GET /resets/{id}"][1], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
