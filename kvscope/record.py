"""`kvscope record`: what a plain SUB socket hears from each replica, written as a capture."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated

import typer
import zmq
from rich.console import Console

from kvscope.collector.capture import CaptureRecord, write_capture
from kvscope.collector.endpoints import StreamEndpoint, replica_streams
from kvscope.config import ConfigError, parse_replica_flag
from kvscope.options import DurationOpt, TopicOpt, fail
from kvscope.signals import stop_on_signals


def out_path(base: Path, name: str, several: bool) -> Path:
    """One file per replica: `X.msgpack.gz` -> `X-NAME.msgpack.gz` when there are several."""
    if not several:
        return base
    file = base.name
    suffix = ".msgpack.gz" if file.endswith(".msgpack.gz") else base.suffix
    stem = file[: -len(suffix)] if suffix else file
    return base.with_name(f"{stem}-{name}{suffix}")


def record_streams(
    specs: list[StreamEndpoint],
    stop: threading.Event,
    duration: float | None = None,
    connected: threading.Event | None = None,
) -> dict[StreamEndpoint, list[CaptureRecord]]:
    """Every `[topic, seq, payload]` message each stream's SUB socket receives, with the
    wall-clock time it arrived, until `stop` (or `duration` seconds)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    poller = zmq.Poller()
    socks: dict[zmq.Socket[bytes], StreamEndpoint] = {}
    got: dict[StreamEndpoint, list[CaptureRecord]] = {spec: [] for spec in specs}
    try:
        for spec in specs:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, spec.topic)
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.setsockopt(zmq.LINGER, 0)
            (sub.bind if spec.bind else sub.connect)(spec.endpoint)
            poller.register(sub, zmq.POLLIN)
            socks[sub] = spec
        if connected is not None:
            connected.set()
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            for sock, _ in poller.poll(100):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 3:  # vLLM's [topic, seq, payload]; anything else is not
                        got[socks[sock]].append(CaptureRecord(time.time(), *frames))
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
    return got


def record(
    replica: Annotated[
        list[str],
        typer.Option("--replica", "-r", help="NAME=ENDPOINT of a KV event publisher (repeat)."),
    ],
    out: Annotated[
        Path, typer.Option(help="Capture file (X-NAME.msgpack.gz per replica when several).")
    ],
    duration: DurationOpt = None,
    topic: TopicOpt = "",
) -> None:
    """Record replicas' KV event streams into capture files, for `kvscope replay`.

    A capture is a gzip of concatenated msgpack records, one per ZMQ message the SUB socket
    received: `[recv_ts: float (wall clock), topic: bin, seq: bin (8 bytes, big-endian),
    payload: bin (vLLM's KVEventBatch msgpack, as sent)]`. Only the live stream is recorded
    (no replay requests). Stops after --duration seconds or on SIGINT/SIGTERM.
    """
    console = Console()
    try:
        named = [parse_replica_flag(spec) for spec in replica]
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if not named:
        raise fail("give at least one --replica NAME=ENDPOINT")
    specs = [s for name, endpoint in named for s in replica_streams(name, endpoint, topic=topic)]
    with stop_on_signals() as stop:
        got = record_streams(specs, stop, duration)
    for spec, records in got.items():
        path = out_path(out, spec.stream.replica, len(specs) > 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_capture(path, records)
        console.print(f"{spec.stream.replica}: {len(records)} messages -> {path}")
