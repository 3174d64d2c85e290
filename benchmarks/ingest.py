"""How fast the collector ingests a realistic vLLM 0.33 KV event stream, and what a block costs.

    python benchmarks/ingest.py [--events N] [--seed S] [--cached C] [--clear-every E]
                                [--no-extras] [--profile]

One run prints, each beside its baseline and target (targets are reported, never asserted):
1. the bound: block-events/s of msgspec decoding alone (`Decoder(MapBatch)`) of the payloads;
2. the collector: block-events/s of the same payloads published by a PUB socket in another
   process over real TCP loopback, received on a SUB socket as the collector receives them
   (`subscriber.message_reader`) and fed to `StreamIngest.live_frames`, from the first message
   received to the last one applied. The publisher sends the whole stream first (high-water
   marks off, so it waits in the SUB socket's queue) and the collector then drains it: the
   collector's own rate on one core. On a two-core machine a publisher sending at the same
   time takes the other core with both sockets' I/O threads, and a Python publisher is
   slower than the collector; that run is printed as information;
3. their ratio;
4. resident bytes per cached block of a 1,000,000-block map, built in a fresh interpreter, in
   memory only and with the store on (SQLite; the writer's log dictionary, known hashes and
   SQLite's cache included, the heap trimmed first): with the writer keeping up (waited for
   after each take's worth of the stream at an H200's rate: the target's figure), and, as
   information, after a backlog of the whole run (what the allocator keeps after it).
The last line is one JSON object with these figures.

A block-event is one hash of a BlockStored or BlockRemoved.

The stream is what vLLM 0.33's BlockPool publishes (checked against the captures in
shared/captures): map-layout events with every non-default field vLLM sets (`lora_id`, `medium`,
`lora_name`, `extra_keys` of one None per block, `group_idx` 0, `kv_cache_spec_kind`), one hash
per BlockRemoved, unsigned 64-bit hashes, 16-token blocks from a 128k vocabulary. A small
scheduler model makes it: requests share Zipf-popular system prompts (prefix hits), prefill in
chunks of up to 32 blocks, decode one block at a time, and free their blocks tail first into an
LRU queue that evictions take from (BlockRemoved before the stores of the same step) once
`--cached` blocks are cached. Every `--clear-every` block-events an AllBlocksCleared empties the
cache (with the running requests, as a preempting reset does).

`--profile` runs the socket measurement under cProfile and prints the top 25 functions by own
time to stderr (the figures of that run are slowed by the profiler).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import multiprocessing as mp
import os
import pstats
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection

import msgspec
import zmq
from _ingest_rss import measure_rss
from _ingest_stream import StreamStats, make_stream

from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.limits import DEFAULT_LIMITS
from kvscope.collector.subscriber import MessageReader, message_reader
from kvscope.collector.types import StreamId
from kvscope.collector.wire import MapBatch

RSS_BLOCKS = 1_000_000
RSS_ROOT_P = 0.02
"""In the RSS map, the share of stores that start a new tree (parent None)."""

TARGET_RATE = 1_000_000
TARGET_RATIO = 0.4
TARGET_RSS = 100

TOPIC = b""
"""vLLM's default topic."""
WARMUP_TOPIC = b"\xffbench-warmup"
RECV_TIMEOUT_MS = 20_000
"""A receive that waits this long means messages were lost: fail instead of hanging."""

MASK64 = (1 << 64) - 1


# --- 1. the bound ------------------------------------------------------------------------------
def measure_bound(payloads: list[bytes], block_events: int, rounds: int = 2) -> float:
    decode = msgspec.msgpack.Decoder(MapBatch).decode
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for payload in payloads:
            decode(payload)
        best = min(best, time.perf_counter() - start)
    return block_events / best


def measure_fast_decode(payloads: list[bytes], block_events: int, rounds: int = 2) -> float:
    """Informational: the compiled decoder alone, to domain events, on the same payloads."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for seq, payload in enumerate(payloads):
            if decode_map_batch(payload, seq, DEFAULT_LIMITS.max_block_size) is None:
                raise RuntimeError(f"the fast decoder declined batch {seq}")
        best = min(best, time.perf_counter() - start)
    return block_events / best


# --- 2. the collector over a socket -------------------------------------------------------------
def _seq_frames(n: int) -> list[bytes]:
    return [seq.to_bytes(8, "big") for seq in range(n)]


def _publish(payloads: list[bytes], conn: Connection) -> None:
    """PUB side: bind, send warm-ups until the subscriber hears one, then everything at once."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    seqs = _seq_frames(len(payloads))
    conn.send(port)
    while not conn.poll(0.01):
        pub.send_multipart([WARMUP_TOPIC, bytes(8), b""])
    conn.recv()
    # Three sends instead of send_multipart: a third cheaper, so that the publisher stays well
    # ahead of the collector.
    send, more = pub.send, zmq.SNDMORE
    start = time.perf_counter()
    for seq, payload in zip(seqs, payloads, strict=True):
        send(TOPIC, more)
        send(seq, more)
        send(payload)
    conn.send(time.perf_counter() - start)
    conn.recv()  # the subscriber has everything
    pub.close(linger=0)
    ctx.term()


@dataclass
class SocketRun:
    rate: float
    seconds: float
    publisher_rate: float
    problems: list[str]
    """What `verify` found wrong with the map the run built."""


class LossError(RuntimeError):
    pass


def measure_socket(
    payloads: list[bytes],
    stats: StreamStats,
    concurrent: bool,
    profile: cProfile.Profile | None = None,
) -> SocketRun:
    """The collector over a socket; with `concurrent`, while the publisher is still sending,
    else once it has sent everything."""
    ours, theirs = mp.Pipe()
    # fork: the child inherits the payloads instead of receiving them pickled
    runner = mp.get_context("fork").Process(target=_publish, args=(payloads, theirs))
    runner.start()
    port = ours.recv()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.MAXMSGSIZE, 64 * 1024 * 1024)
    sub.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        sub.recv_multipart()  # a warm-up: the subscription has reached the publisher
        ours.send("go")
        if not concurrent:
            publish_seconds: float = ours.recv()
        ingest, seconds = _collect(sub, len(payloads), profile)
        if concurrent:
            publish_seconds = ours.recv()
    except zmq.Again as exc:
        raise LossError(f"no message for {RECV_TIMEOUT_MS} ms: messages were lost") from exc
    finally:
        ours.send("done")
        runner.join(10)
        sub.close(linger=0)
        ctx.term()
    return SocketRun(
        stats.block_events / seconds,
        seconds,
        stats.block_events / publish_seconds,
        verify(ingest, len(payloads), stats),
    )


def _collect(
    sub: zmq.Socket[bytes], n: int, profile: cProfile.Profile | None
) -> tuple[StreamIngest, float]:
    """The measured part: what `Collector._drain_live` does for each message."""
    ingest = StreamIngest(StreamId("bench", 0), can_replay=False)
    live = ingest.live_frames
    monotonic = time.monotonic
    read = message_reader(sub)
    frames = _next_message(sub, read)
    while frames[0] == WARMUP_TOPIC:
        frames = _next_message(sub, read)
    if profile is not None:
        profile.enable()
    start = monotonic()
    live(frames, start)
    for _ in range(n - 1):
        got = read()
        # None: the publisher is behind; wait as the collector's poll loop does.
        live(_next_message(sub, read) if got is None else got, monotonic())
    seconds = monotonic() - start
    if profile is not None:
        profile.disable()
    return ingest, seconds


def _next_message(sub: zmq.Socket[bytes], read: MessageReader) -> list[bytes]:
    frames = read()
    while frames is None:
        if not sub.poll(RECV_TIMEOUT_MS):
            raise zmq.Again()
        frames = read()
    return frames


def measure_no_socket(payloads: list[bytes], stats: StreamStats) -> tuple[float, list[str]]:
    """The same ingest with frames made in the loop: the collector's own cost."""
    seqs = _seq_frames(len(payloads))
    ingest = StreamIngest(StreamId("bench", 0), can_replay=False)
    live = ingest.live_frames
    monotonic = time.monotonic
    start = monotonic()
    for seq, payload in zip(seqs, payloads, strict=True):
        live([TOPIC, seq, payload], monotonic())
    rate = stats.block_events / (monotonic() - start)
    return rate, verify(ingest, len(payloads), stats)


def verify(ingest: StreamIngest, sent: int, stats: StreamStats) -> list[str]:
    """What is wrong with the map the run built (empty when nothing was lost or refused)."""
    problems = []
    c, m = ingest.counters, ingest.map.counters
    if c.batches_applied != sent:
        problems.append(f"applied {c.batches_applied} of {sent} batches")
    if ingest.degraded is not None:
        problems.append(f"degraded: {ingest.degraded.reason}")
    if c.malformed:
        problems.append(f"malformed: {dict(c.malformed)}")
    if m.stored_blocks + m.removed_blocks != stats.block_events:
        problems.append(f"{m.stored_blocks + m.removed_blocks} block-events applied")
    if m.clears != stats.clears:
        problems.append(f"{m.clears} clears applied, {stats.clears} sent")
    blocks = ingest.map.totals().blocks
    if blocks != stats.final_cached:
        problems.append(f"{blocks} blocks in the map, the engine caches {stats.final_cached}")
    unknown = sum(t.unknown_removals for t in ingest.map.tables.values())
    if unknown:
        problems.append(f"{unknown} removals of unknown hashes")
    return problems


# --- the report ----------------------------------------------------------------------------------
def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISS"


@contextmanager
def _step(what: str) -> Iterator[None]:
    _say(f"... {what}")
    start = time.perf_counter()
    yield
    _say(f"    {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="block-events to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cached", type=int, default=100_000, help="steady-state cached blocks")
    parser.add_argument(
        "--clear-every", type=int, default=400_000, help="block-events between AllBlocksCleared"
    )
    parser.add_argument(
        "--no-extras",
        action="store_true",
        help="skip the informational runs (publisher sending meanwhile, no socket)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the socket ingest")
    args = parser.parse_args()

    with _step(f"generating {args.events:,} block-events"):
        payloads, stats = make_stream(args.events, args.seed, args.cached, args.clear_every)
    gc.collect()
    n_events = stats.stores + stats.removals + stats.clears
    print(
        f"stream: {stats.block_events:,} block-events in {stats.batches:,} batches "
        f"({n_events / stats.batches:.1f} events, {stats.block_events / stats.batches:.1f} "
        f"block-events, {stats.payload_bytes / stats.batches:.0f} bytes per batch); "
        f"{stats.stores:,} stores of {stats.stored_blocks / stats.stores:.1f} blocks on average, "
        f"{stats.removals:,} single-hash removals, {stats.clears} clears; "
        f"cache of {args.cached:,} blocks; {os.cpu_count()} CPUs"
    )
    with _step("decoding alone"):
        bound = measure_bound(payloads, stats.block_events)
    with _step("compiled decoding alone"):
        fast_decode = measure_fast_decode(payloads, stats.block_events)
    profile = cProfile.Profile() if args.profile else None
    try:
        with _step("socket, publisher done sending first"):
            run = measure_socket(payloads, stats, False, profile)
    except LossError as exc:
        sys.exit(f"collector run failed: {exc}")
    if run.problems:
        sys.exit("collector run lost or refused data: " + "; ".join(run.problems))
    gc.collect()
    extras: list[str] = []
    if not args.no_extras:
        with _step("socket, publisher sending meanwhile"):
            concurrent_run = measure_socket(payloads, stats, True)
        extras.append(
            f"  info: while the publisher process sends (at {concurrent_run.publisher_rate:,.0f}"
            f"/s, sharing the 2 cores): {concurrent_run.rate:,.0f} block-events/s "
            f"({'; '.join(concurrent_run.problems) or 'no loss'})"
        )
        del concurrent_run
        gc.collect()
        with _step("no socket"):
            bare_rate, bare_problems = measure_no_socket(payloads, stats)
        extras.append(
            f"  info: same ingest, frames from a list (no socket): {bare_rate:,.0f} "
            f"block-events/s ({bare_rate / bound:.2f}x the bound; "
            f"{'; '.join(bare_problems) or 'no loss'})"
        )
    del payloads
    gc.collect()
    with _step(f"RSS of {RSS_BLOCKS:,} cached blocks (fresh interpreter)"):
        rss = measure_rss(RSS_BLOCKS, args.seed)
    with _step(f"RSS of {RSS_BLOCKS:,} cached blocks, store on (fresh interpreter)"):
        store_rss = measure_rss(RSS_BLOCKS, args.seed, store=True, keep_up=True)
    with _step(f"RSS of {RSS_BLOCKS:,} cached blocks, store on after a backlog"):
        backlog_rss = measure_rss(RSS_BLOCKS, args.seed, store=True)

    ratio = run.rate / bound
    print(f"bound: msgspec decode alone (Decoder(MapBatch)):  {bound:>12,.0f} block-events/s")
    print(
        f"  info: compiled decode alone (_wire_fast), to events: {fast_decode:,.0f} "
        f"block-events/s ({fast_decode / bound:.2f}x the bound)"
    )
    print(
        f"collector: ZMQ SUB -> StreamIngest.live_frames:   {run.rate:>12,.0f} block-events/s"
        f"   target >= {TARGET_RATE:,}  [{_mark(run.rate >= TARGET_RATE)}]"
        f"   ({run.seconds:.2f} s, draining what the publisher had sent;"
        f" {stats.batches:,} batches applied, no loss, not degraded)"
    )
    for line in extras:
        print(line)
    print(
        f"ratio: collector / bound:                         {ratio:>12.2f}x"
        f"                 target >= {TARGET_RATIO}x  [{_mark(ratio >= TARGET_RATIO)}]"
    )
    print(
        f"memory: RSS per cached block ({RSS_BLOCKS:,} blocks): {rss:>10,.0f} bytes"
        f"                target <= {TARGET_RSS}  [{_mark(rss <= TARGET_RSS)}]"
    )
    print(
        f"  with the store on (SQLite), writer keeping up: {store_rss:>10,.0f} bytes"
        f"                target <= {TARGET_RSS}  [{_mark(store_rss <= TARGET_RSS)}]"
        f"   ({store_rss - rss:+,.0f} over memory only)"
    )
    print(
        f"  info: the store on after a backlog of the whole run: {backlog_rss:,.0f} bytes"
        f" ({backlog_rss - store_rss:+,.0f} over keeping up: what the allocator keeps)"
    )
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        _say(out.getvalue())
    print(
        json.dumps(
            {
                "bound_block_events_per_s": round(bound),
                "collector_block_events_per_s": round(run.rate),
                "ratio": round(ratio, 3),
                "rss_bytes_per_cached_block": round(rss, 1),
                "rss_bytes_per_cached_block_store_on": round(store_rss, 1),
                "rss_bytes_per_cached_block_store_on_after_backlog": round(backlog_rss, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
