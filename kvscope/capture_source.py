"""A recorded stream played back as a vLLM publisher would send it: PUB plus a replay ROUTER.

The demo's built-in source when no vLLM is at hand. It speaks vLLM >= 0.26's protocol exactly
(`[topic, seq, payload]` live; replay replies `[identity, b"", topic, seq, payload]`, then an end
marker), so the collector cannot tell it from the real publisher.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from kvscope.collector.capture import CaptureRecord
from kvscope.collector.replay import END_SEQ


class CaptureSource:
    def __init__(
        self,
        records: Sequence[CaptureRecord],
        endpoint: str = "tcp://127.0.0.1:*",
        replay_endpoint: str = "tcp://127.0.0.1:*",
        speed: float = 0.0,
        buffer_steps: int = 10_000,
    ) -> None:
        """`speed` is a multiple of the recorded pace; 0 plays as fast as possible."""
        self.records = records
        self.speed = speed
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.bind(endpoint)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.bind(replay_endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[CaptureRecord] = deque(maxlen=buffer_steps)
        self._stop = threading.Event()
        self._go = threading.Event()
        self.published = 0
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capture-source", daemon=True)
        self._thread.start()

    def play(self) -> None:
        """Start publishing (sockets are up from construction, so subscribers can join first)."""
        self._go.set()

    def close(self) -> None:
        self._stop.set()
        self._go.set()
        self._thread.join(5)
        self._pub.close(linger=0)
        self._router.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._go.is_set():
            self._serve_replays(poller, 20)
        start_wall = time.monotonic()
        first_ts = self.records[0].recv_ts if self.records else 0.0
        for record in self.records:
            if self._stop.is_set():
                return
            if self.speed > 0:
                due = start_wall + (record.recv_ts - first_ts) / self.speed
                while (wait := due - time.monotonic()) > 0 and not self._stop.is_set():
                    self._serve_replays(poller, min(int(wait * 1000) + 1, 50))
            self._pub.send_multipart(record.frames)
            self._buffer.append(record)
            self.published += 1
            self._serve_replays(poller, 0)
        self.done.set()
        while not self._stop.is_set():
            self._serve_replays(poller, 50)

    def _serve_replays(self, poller: zmq.Poller, timeout_ms: int) -> None:
        if not poller.poll(timeout_ms):
            return
        request = self._router.recv_multipart()
        if len(request) != 3:
            return  # vLLM logs and ignores such requests too
        identity, _, start = request
        start_seq = int.from_bytes(start, "big")
        for record in self._buffer:
            if record.seq >= start_seq:
                self._router.send_multipart(
                    [identity, b"", record.topic, record.seq_frame, record.payload]
                )
        self._router.send_multipart([identity, b"", b"", END_SEQ, b""])
