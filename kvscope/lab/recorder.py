"""Records a publisher's stream exactly as a ZMQ SUB socket receives it (no vLLM here).

The recording is the capture format of `kvscope/data/FORMAT.md`: one
`[recv_ts, topic, seq, payload]` record per received message, gzip'ed msgpack.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import zmq

from kvscope.collector.capture import CaptureRecord, write_capture


class StreamRecorder:
    """A SUB socket on its own thread: connect, wait for the handshake, keep every message.

    Start it before the publisher sends anything (PUB/SUB drops what is sent before a
    subscriber has joined). `drain(last_seq)` waits until that seq has arrived.
    """

    def __init__(self, endpoint: str, topic: bytes = b"", join_wait_s: float = 0.1) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.join_wait_s = join_wait_s
        self.records: list[CaptureRecord] = []
        self.drain_wait_s = 0.0
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lab-recorder", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            self.close()
            raise TimeoutError(f"recorder could not connect to {self.endpoint}")
        if self._error is not None:
            raise RuntimeError(f"recorder failed on {self.endpoint}") from self._error
        time.sleep(self.join_wait_s)  # the subscription travels after the handshake

    @property
    def last_seq(self) -> int | None:
        with self._lock:
            return self.records[-1].seq if self.records else None

    def drain(self, last_seq: int | None, timeout: float = 10.0) -> bool:
        """Wait until the message with `last_seq` (or a later one) was received."""
        if last_seq is None:
            return True
        started = time.monotonic()
        deadline = started + timeout
        with self._arrived:
            while not self.records or self.records[-1].seq < last_seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(min(left, 0.05))
            done = bool(self.records) and self.records[-1].seq >= last_seq
        self.drain_wait_s = time.monotonic() - started
        return done

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def write(self, path: str | Path) -> int:
        with self._lock:
            records = list(self.records)
        return write_capture(path, records)

    def summary(self) -> dict[str, Any]:
        """The sidecar's `subscriber` section: what arrived, and which seqs did not."""
        with self._lock:
            records = list(self.records)
        seqs = [r.seq for r in records]
        first = seqs[0] if seqs else None
        last = seqs[-1] if seqs else None
        present = set(seqs)
        missing = [s for s in range(0, last + 1) if s not in present] if last is not None else []
        return {
            "messages": len(records),
            "payload_bytes": sum(len(r.payload) for r in records),
            "first_seq": first,
            "last_seq": last,
            "expected": 0 if last is None else last + 1,
            "missing_seqs": missing[:1000],
            "num_missing": len(missing),
            "recv_span_s": records[-1].recv_ts - records[0].recv_ts if records else 0.0,
            "drain_wait_s": round(self.drain_wait_s, 3),
        }

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 0)  # never drop on our side
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.connect(self.endpoint)
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while not self._stop.is_set():
                for sock, _ in poller.poll(20):
                    if sock is monitor:
                        monitor.recv_multipart()
                        self._ready.set()
                        continue
                    received = []
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        now = time.time()
                        if len(frames) == 3:
                            received.append(CaptureRecord(now, frames[0], frames[1], frames[2]))
                    if received:
                        with self._arrived:
                            self.records.extend(received)
                            self._arrived.notify_all()
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            ctx.term()
