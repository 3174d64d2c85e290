"""A lab run: several `LabReplica`s side by side, each on its own thread, then a report.

Imports vLLM (through `kvscope.lab.replica`): load it only from the lab command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvscope.lab.replica import LabReplica
from kvscope.lab.report import ReplicaSummary
from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import ScheduledReset, WorkloadSpec


@dataclass(frozen=True)
class LabOptions:
    replicas: int = 1
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    engine: EngineSettings = field(default_factory=EngineSettings)
    duration: float | None = 60.0
    """Simulated seconds; None: until stopped."""
    speed: float = 0.0
    resets: Sequence[ScheduledReset] = ()
    record: Path | None = None
    port: int = 0
    """Publisher port of the first replica (replica i: port + 2 i); 0: chosen by the OS."""
    replay_port: int = 0
    """Replay port of the first replica (replica i: replay_port + 2 i); 0: chosen by the OS."""
    http_port: int = 0
    """HTTP port of the first replica (replica i: http_port + i); 0: chosen by the OS."""
    http_host: str = "127.0.0.1"
    snapshot_every: float | None = 30.0
    name: str = "lab"
    preset: str | None = None
    """The preset the workload and engine came from (for the sidecars)."""


def record_path(base: Path, name: str, replicas: int) -> Path:
    """One file per replica: `X.msgpack.gz` -> `X-NAME.msgpack.gz` when there are several."""
    if replicas == 1:
        return base
    file = base.name
    suffix = ".msgpack.gz" if file.endswith(".msgpack.gz") else base.suffix
    stem = file[: -len(suffix)] if suffix else file
    return base.with_name(f"{stem}-{name}{suffix}")


def replica_names(options: LabOptions) -> list[str]:
    if options.replicas == 1:
        return [options.name]
    return [f"{options.name}{i}" for i in range(options.replicas)]


def build_replicas(options: LabOptions) -> list[LabReplica]:
    built: list[LabReplica] = []
    workload = replace(options.workload, duration=options.duration)
    try:
        for i, name in enumerate(replica_names(options)):
            built.append(
                LabReplica(
                    name,
                    workload,
                    options.engine,
                    stream=i,
                    speed=options.speed,
                    port=options.port + 2 * i if options.port else 0,
                    replay_port=options.replay_port + 2 * i if options.replay_port else 0,
                    http_port=options.http_port + i if options.http_port else 0,
                    http_host=options.http_host,
                    record=(
                        record_path(options.record, name, options.replicas)
                        if options.record is not None
                        else None
                    ),
                    resets=options.resets,
                    snapshot_every=options.snapshot_every,
                    preset=options.preset,
                )
            )
    except BaseException:
        for replica in built:
            replica.close()
        raise
    return built


def run_lab(
    options: LabOptions,
    stop: threading.Event | None = None,
    on_ready: Callable[[Sequence[LabReplica]], None] | None = None,
    linger: float = 0.0,
) -> list[ReplicaSummary]:
    """Run every replica for `options.duration` simulated seconds (or until `stop`).

    `on_ready` sees the replicas once their sockets are up, before the first step. After the
    run they stay up `linger` more wall seconds (HTTP, replay: a collector can catch up).
    """
    replicas = build_replicas(options)
    try:
        if on_ready is not None:
            on_ready(replicas)
        for replica in replicas:
            replica.start(options.duration)
        while not all(r.run_done.is_set() for r in replicas):
            if stop is not None and stop.wait(0.1):
                break
            if stop is None:
                time.sleep(0.1)
        for replica in replicas:
            if replica.run_done.is_set():
                replica.wait(0)  # re-raises a failed loop
        if linger > 0 and (stop is None or not stop.is_set()):
            if stop is None:
                time.sleep(linger)
            else:
                stop.wait(linger)
    finally:
        for replica in replicas:
            replica.close()
    return [replica.summary() for replica in replicas]
