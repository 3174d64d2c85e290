"""benchmarks/fleet.py's publishers: many paced vLLM-like publishers per process, in connect mode.

Each replica is a PUB socket that *connects* to the collector's bound SUB, with the llm-d topic
`kv@127.0.0.1:<replay port>@fleet`, and a replay ROUTER it binds on that port, answering as vLLM
>= 0.26 does. All replicas play the same pre-encoded batches (benchmarks/_ingest_stream.py), each
from seq 0 at its own pace: batch i goes out `cum[i] / rate` seconds after the replica's start
(its block-events so far over its rate), with the send time written into the batch's `ts`, so
the collector's lag is measured against the moment of sending. A replica remembers the `ts` of
every batch it sent, so a replay rebuilds those batches byte for byte (the last
`REPLAY_BUFFER` of them, as vLLM's `buffer_steps`).
"""

from __future__ import annotations

import heapq
import math
import random
import struct
import time
from array import array
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event

import zmq

REPLAY_BUFFER = 10_000
"""Batches a replica can replay: vLLM's default `buffer_steps`."""
TS_HEAD = b"\x93\xcb"
"""A batch's first bytes: a 3-element array, then its `ts` as a float64."""
END_MARKER = [b"", b"", b"\xff" * 8, b""]
TICK_S = 0.002
"""The publishers' loop sends what is due, then answers replays for at most this long."""


@dataclass(frozen=True, slots=True)
class Stream:
    """What every replica publishes (picklable: it crosses to a spawned process)."""

    payloads: list[bytes]
    cum_events: list[int]
    """Block-events before each batch."""
    rate: float
    """Block-events a second per replica."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one publisher process drives."""

    bind: str
    """The collector's address, which every PUB connects to."""
    replicas: int
    stream: Stream
    seed: int


@dataclass(frozen=True, slots=True)
class Sent:
    """One replica's account, sent back once the process stops."""

    replica: str
    """Its stream's replica name, `127.0.0.1:<replay port>`."""
    sent_ts: array[float]
    """When each batch went out, by seq."""
    replays: int

    @property
    def batches(self) -> int:
        return len(self.sent_ts)


def with_ts(payload: bytes, ts: float) -> bytes:
    return TS_HEAD + struct.pack(">d", ts) + payload[10:]


class _Replica:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], bind: str) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, 0)  # vLLM >= 0.33: a long replay is not cut short
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.name = f"127.0.0.1:{port}"
        self.topic = f"kv@{self.name}@fleet".encode()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(bind)
        self.sent_ts = array("d")
        self.replays = 0

    def send(self, payload: bytes) -> None:
        ts = time.time()
        seq = len(self.sent_ts)
        self.sent_ts.append(ts)
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), with_ts(payload, ts)])

    def answer(self, payloads: list[bytes]) -> None:
        """One replay request: every buffered batch from the seq asked for, then the end."""
        while True:
            try:
                identity, _, start = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue  # not a [identity, b"", seq8] request: vLLM ignores it too
            self.replays += 1
            sent = len(self.sent_ts)
            first = max(int.from_bytes(start, "big"), sent - REPLAY_BUFFER, 0)
            for seq in range(first, sent):
                body = with_ts(payloads[seq], self.sent_ts[seq])
                self.router.send_multipart(
                    [identity, b"", self.topic, seq.to_bytes(8, "big"), body]
                )
            self.router.send_multipart([identity, *END_MARKER])


def run_publishers(
    plan: Plan, ready: Connection, start_at: Connection, stop_sending: Event, stop: Event
) -> None:
    """A publisher process: reports its replicas' names on `ready`, waits for the start time on
    `start_at`, sends until `stop_sending`, answers replays until `stop`, then reports `Sent`s."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    replicas = [_Replica(ctx, plan.bind) for _ in range(plan.replicas)]
    poller = zmq.Poller()
    by_router = {r.router: r for r in replicas}
    for router in by_router:
        poller.register(router, zmq.POLLIN)
    ready.send([r.name for r in replicas])
    t0: float = start_at.recv()
    rng = random.Random(plan.seed)
    payloads, cum, rate = plan.stream.payloads, plan.stream.cum_events, plan.stream.rate
    # (due, replica, next batch): replicas start spread over one batch's time, not in step.
    due = [(t0 + rng.random() * cum[1] / rate, i, 0) for i in range(len(replicas))]
    starts = {i: at for at, i, _ in due}
    heapq.heapify(due)
    while not stop.is_set():
        now = time.time()
        while due and due[0][0] <= now and not stop_sending.is_set():
            _, i, batch = heapq.heappop(due)
            replicas[i].send(payloads[batch])
            if batch + 1 < len(payloads):
                heapq.heappush(due, (starts[i] + cum[batch + 1] / rate, i, batch + 1))
        wait_s = TICK_S if not due or stop_sending.is_set() else min(TICK_S, due[0][0] - now)
        for sock, _ in poller.poll(math.ceil(max(0.0, wait_s) * 1000)):
            by_router[sock].answer(payloads)
    ready.send([Sent(r.name, r.sent_ts, r.replays) for r in replicas])
    for r in replicas:
        r.pub.close(linger=0)
        r.router.close(linger=0)
    ctx.term()
