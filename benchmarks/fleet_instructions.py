"""What one fleet message costs the collector's thread, in instructions counted by callgrind:
routing and ingest without the socket, a figure that holds still on a shared machine.

    python benchmarks/fleet_instructions.py [--publishers 10] [--messages 1000] [--seed 1]
                                            [--sink memory|calls] [--receive] [--annotate DIR]

The stream is benchmarks/fleet.py's (one replica's batches at an H200's rate, a reset every 40 s
of it), played by `--publishers` publishers with llm-d topics, round-robin, each from seq 0.
Each message goes through the collector's fleet drain, one message a call of its loop
(collector/_fleet_drain.pyx's `DrainLoop`, which `FleetDrain.drain` runs):
`FleetRouter.route_batch` and its stream's `StreamIngest.live_frames`, memory-only (no sink), or
with `--sink calls` a sink that does nothing with what it is told (a stream with a sink, as a
stored fleet's, applies each batch from its bytes as the router read it, and tells
its sink of it without a `Batch`). With `--receive`, each message is also received as the
drain receives it (`sockets.message_reader`) from a SUB socket, every message published to it
beforehand over inproc (libzmq's I/O thread is not counted). Two windows of `--messages`
messages are counted, each after the messages before it ran uncounted:
- `fill`: the messages just before the first that evicts, while the tables grow largest;
- `eviction`: from the first batch that evicts (a BlockRemoved: the cache is full) on.
It prints instructions per message of each. `--annotate DIR` keeps callgrind's output files
there (`callgrind_annotate DIR/fill.out` splits the count by function). Needs valgrind.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

import msgspec
from _callgrind import (
    collected,
    need_valgrind,
    read_payloads,
    run_child,
    say_source,
    source,
    write_payloads,
)

HERE = Path(__file__).resolve().parent
WINDOWS = ("fill", "eviction")
CLOCK_START = 1_796_051_000.0
"""The receive clock, fixed: `time.time()` would differ between runs."""
RATE = 2500.0
"""Block-events a second per replica: an H200's (benchmarks/fleet.py's default)."""
RESET_EVERY_S = 40.0


def messages(payloads: list[bytes], publishers: int) -> list[list[bytes]]:
    """Every publisher's batches in turn: [topic, seq, payload] per message."""
    topics = [f"kv@127.0.0.1:{6000 + p}@fleet".encode() for p in range(publishers)]
    return [
        [topic, seq.to_bytes(8, "big"), payload]
        for seq, payload in enumerate(payloads)
        for topic in topics
    ]


def received(frames: list[list[bytes]]) -> Callable[[], list[bytes] | None]:
    """A `MessageReader` of a SUB socket to which `frames` were all published (over inproc)."""
    import zmq

    from kvscope.collector.sockets import message_reader

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    pub.setsockopt(zmq.SNDHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind("inproc://fleet")
    pub.connect("inproc://fleet")
    while True:  # until the subscription has reached the PUB: a probe gets through
        pub.send(b"probe")
        if sub.poll(100):
            break
    while sub.poll(0):
        sub.recv()
    for message in frames:  # inproc: each is on the SUB's queue when this returns
        pub.send_multipart(message)
    return message_reader(sub)


def child(
    payloads_file: str, publishers: int, start: int, count: int, sink: str, receive: bool
) -> None:
    """Messages [0, start) uncounted, then [start, start + count) counted (callgrind counts
    inside `deque_init`)."""
    from kvscope.collector import prefix_map
    from kvscope.collector._fleet_drain import DrainLoop
    from kvscope.collector.fleet import FleetSettings
    from kvscope.collector.fleet_router import FleetRouter, Route
    from kvscope.collector.ingest import StreamIngest
    from kvscope.collector.sink import NO_BATCH, AppliedBatch, MapReader, NullSink, Span
    from kvscope.collector.stream_table import StreamTable
    from kvscope.collector.types import StreamId

    class Calls(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            return None

        def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
            return NO_BATCH

    say_source(prefix_map.__file__)
    payloads = read_payloads(payloads_file)
    frames = messages(payloads, publishers)[: start + count]
    assert len(frames) == start + count, "the stream is too short for this window"
    router = FleetRouter(FleetSettings(bind="tcp://127.0.0.1:5557"))  # as the subscriber's
    streams: StreamTable[Followed] = StreamTable()
    # One more stamp for each stream's registration, which reads the clock too.
    clock = iter([CLOCK_START + 0.0004 * i for i in range(len(frames) + publishers)])

    class Followed:
        """A stream as the drain reads it (collector/sockets.py's `StreamSockets`)."""

        def __init__(self, ingest: StreamIngest) -> None:
            self.ingest = ingest

        def send_replay(self, request: object) -> None:
            raise AssertionError("no replay is asked for")

    class Drain:
        """`FleetDrain`'s part in the loop: a stream for each publisher heard first."""

        def _register(self, to: Route, now: float) -> Followed:
            told = Calls() if sink == "calls" else None
            stream = Followed(StreamIngest(to.stream, can_replay=False, sink=told))
            streams.put(to.stream, stream)
            return stream

    # FleetDrain.drain's loop, one message a call, with or without the socket (PUB to SUB
    # keeps the order).
    read = received(frames) if receive else iter(frames).__next__
    step = DrainLoop(read, router.route_batch, clock.__next__, streams, set(), Drain())

    for message in frames[:start]:
        assert step(message)
    # As the subscriber does at start-up (collector/subscriber.py): a full collection in the
    # window would otherwise walk this benchmark's own lists of messages, which no collector holds.
    gc.collect()
    gc.freeze()
    deque(map(step, frames[start:]), maxlen=0)
    applied = sum(stream.ingest.counters.batches_applied for stream in streams.values())
    assert applied == len(frames), (applied, len(frames))


def first_eviction(payloads: list[bytes]) -> int:
    """The index of the first batch that removes a block."""
    sys.path.insert(0, str(HERE))
    from _ingest_stream import VllmBlockRemoved, VllmEventBatch

    decode = msgspec.msgpack.Decoder(VllmEventBatch).decode
    for i, payload in enumerate(payloads):
        if any(isinstance(e, VllmBlockRemoved) for e in decode(payload).events):
            return i
    raise SystemExit("the stream never evicts")


def instructions(window: str, args: list[str], out_dir: str) -> int:
    command = [sys.executable, __file__, "--child", *args]
    stderr = run_child(command, f"{out_dir}/{window}.out")
    print(f"  ({window}: {source(stderr)})")
    return collected(stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--messages", type=int, default=1000, help="messages counted a window")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sink", choices=("memory", "calls"), default="memory")
    parser.add_argument("--receive", action="store_true", help="also receive each message")
    parser.add_argument("--annotate", help="keep callgrind's files in this folder")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        payloads_file, publishers, start, count, sink, receive = args.child
        child(payloads_file, int(publishers), int(start), int(count), sink, receive == "1")
        return
    need_valgrind("fleet_instructions.py")
    sys.path.insert(0, str(HERE))
    from fleet import fleet_stream

    n, p = args.messages, args.publishers
    payloads = fleet_stream(RATE, RESET_EVERY_S, args.seed, RESET_EVERY_S).payloads
    evicts = first_eviction(payloads) * p
    starts = {"fill": max(p, evicts - n), "eviction": evicts}
    print(
        f"stream: {len(payloads):,} batches a publisher, {p} publishers, {n:,} messages a window,"
        f" sink: {args.sink}, received: {'yes' if args.receive else 'no'}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.annotate or tmp
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        payloads_file = write_payloads(payloads, tmp)
        counts = {
            window: instructions(
                window,
                [payloads_file, str(p), str(starts[window]), str(n), args.sink, str(+args.receive)],
                out_dir,
            )
            for window in WINDOWS
        }
    for window in WINDOWS:
        print(f"{window:<9} {counts[window] / n:10,.0f} instructions per message")


if __name__ == "__main__":
    main()
