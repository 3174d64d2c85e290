"""The lab: vLLM's real v1 Scheduler with no model, its resets, its API, its recordings.

Every test drives `LabReplica` (vLLM 0.33's own Scheduler, KVCacheManager, BlockPool and
ZmqEventPublisher on CPU) in simulated time as fast as it goes, and holds it to vLLM's own
BlockPool: the collector, fed over real sockets, must equal `cached_block_hash_to_block` at
every checkpoint; a recording must replay to the ground truth written beside it.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import msgspec
import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
import vllm
from typer.testing import CliRunner
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.v1.request import Request, RequestStatus

from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.discovery import discover
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId
from kvscope.lab.replica import LabReplica
from kvscope.lab.sidecar import sidecar_path_for
from kvscope.lab.workload import (
    ResetMode,
    ScheduledReset,
    Workload,
    WorkloadSpec,
    parse_range,
    parse_resets,
    periodic_resets,
)
from kvscope.storage.scrape import parse_vllm_metrics

pytestmark = pytest.mark.vllm

SYNC_TIMEOUT_S = 10.0
BLOCK = 16


@pytest.fixture
def replica() -> Iterator[LabReplica]:
    lab = LabReplica("lab", WorkloadSpec(rate=4.0, seed=11))
    yield lab
    lab.close()


# --- helpers ------------------------------------------------------------------------------------
def start_collector(replica: LabReplica) -> tuple[Collector, StreamId]:
    """A collector on the streams the replica's /kv_event_sources lists, past its first replay."""
    assert replica.http_url is not None
    streams = discover(replica.name, replica.http_url)
    collector = Collector(streams, settings=CollectorSettings(replay_timeout_s=2.0))
    collector.start()
    stream = streams[0].stream
    wait_for(
        collector,
        lambda: (
            collector.is_connected(stream)
            and collector.ingests[stream].counters.replays_ok >= 1
            and not collector.ingests[stream].replaying
        ),
        lambda: f"{stream} ready",
    )
    return collector, stream


def wait_for(collector: Collector, condition: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        with collector.lock:
            if condition():
                return
        if time.monotonic() > deadline:
            with collector.lock:
                raise AssertionError(f"timed out waiting for {what()}")
        time.sleep(0.002)


def assert_exact(collector: Collector, stream: StreamId, replica: LabReplica) -> int:
    """Wait until the collector applied every published batch; its map must be the BlockPool's.

    Returns the collector's orphan count (stored blocks whose parent is not cached).
    """
    last_seq = replica.last_seq
    ingest = collector.ingests[stream]
    wait_for(
        collector,
        lambda: ingest.last_seq == last_seq and not ingest.replaying,
        lambda: f"seq {last_seq}: at {ingest.last_seq}, counters {ingest.counters}",
    )
    want = replica.truth_counts()
    with collector.lock:
        got = ingest.map.counts()
        orphans = ingest.map.totals().orphans
        assert ingest.degraded is None
    assert got == want, f"collector {len(got)} hashes, BlockPool {len(want)} at seq {last_seq}"
    return orphans


def computed_tokens(requests: list[Request]) -> dict[str, int]:
    return {r.request_id: r.num_computed_tokens for r in requests}


def will_fill_a_block(request: Request) -> bool:
    """Running in decode, with at least one more full block to write before it finishes."""
    params = request.sampling_params
    assert params is not None and params.max_tokens is not None
    left = params.max_tokens - request.num_output_tokens
    return request.num_computed_tokens >= request.num_prompt_tokens and left > BLOCK + 1


def http(method: str, url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return status, json.loads(body) if body else None


# --- the tests ----------------------------------------------------------------------------------
def test_resets_in_three_modes_and_the_collector_follows(replica: LabReplica) -> None:
    """Default fails under load, preempt preempts everyone, keep keeps everyone and leaves
    orphans; the collector equals the BlockPool at every checkpoint throughout."""
    collector, stream = start_collector(replica)
    try:
        stored_parents: list[tuple[int, int | None, bool]] = []

        def observe(seq: int, batch: KVEventBatch) -> None:
            # (seq, parent, parent cached when published), for the keep reset's orphans
            cached = {h for h, _ in replica.truth_counts()}
            for event in batch.events:
                if isinstance(event, BlockStored):
                    parent = event.parent_block_hash
                    assert parent is None or isinstance(parent, int)
                    stored_parents.append((seq, parent, parent in cached))

        replica.batch_observers.append(observe)
        checkpoints = 0
        for _ in range(8):
            replica.run_for(2.5)
            assert_exact(collector, stream, replica)
            checkpoints += 1
        assert replica.events["BlockRemoved"] > 0, "the workload should evict"

        # Default: fails while requests hold blocks, emits nothing, changes nothing.
        assert replica.run_until(lambda: replica.num_running >= 2, max_seconds=60)
        before = replica.truth_counts()
        held = replica.held_blocks
        record = replica.reset(ResetMode.DEFAULT)
        assert record.result is False and record.running_before >= 2
        assert record.held_blocks_before == held > 0 and record.held_blocks_unchanged
        assert record.pending_events_after == 0 and record.preempted == 0
        assert replica.truth_counts() == before
        replica.run_for(1.0)
        assert record.cleared_in_seq is None
        assert_exact(collector, stream, replica)

        # Preempt: every running request is preempted (its computed tokens thrown away).
        replica.run_for(5.0)
        assert replica.run_until(lambda: replica.num_running >= 2, max_seconds=60)
        running = replica.running_requests
        lost = sum(computed_tokens(running).values())
        record = replica.reset(ResetMode.PREEMPT)
        assert record.result is True
        assert record.preempted == record.running_before == len(running) >= 2
        assert record.running_after == 0 and record.waiting_after >= len(running)
        assert record.computed_tokens_lost == lost > 0
        assert all(r.status == RequestStatus.PREEMPTED for r in running)
        assert all(r.num_computed_tokens == 0 for r in running)
        assert record.held_blocks_after == 0 and record.hashed_blocks_after == 0
        assert record.pending_events_after == 1 and replica.truth_counts() == {}
        replica.step()  # the AllBlocksCleared goes out with the next step
        assert record.cleared_in_seq == replica.cleared_seqs[-1]
        assert_exact(collector, stream, replica)
        with collector.lock:
            assert collector.ingests[stream].map.counters.clears == 1

        # Keep: nothing preempted; running requests keep their blocks and computed tokens.
        replica.run_for(5.0)
        assert replica.run_until(
            lambda: (
                replica.num_running >= 2
                and any(will_fill_a_block(r) for r in replica.running_requests)
            ),
            max_seconds=60,
        )
        running = replica.running_requests
        tokens = computed_tokens(running)
        cached_before = {h for h, _ in replica.truth_counts()}
        record = replica.reset(ResetMode.KEEP)
        assert record.result is True and record.preempted == 0
        assert record.running_after == record.running_before == len(running)
        assert computed_tokens(replica.running_requests) == tokens
        assert all(r.status == RequestStatus.RUNNING for r in running)
        assert record.running_computed_tokens_after == record.running_computed_tokens_before
        assert record.held_blocks_unchanged and record.held_blocks_before > 0
        assert record.hashed_blocks_after == 0 and replica.truth_counts() == {}
        assert record.pending_events_after == 1
        seq_of_reset = replica.batches_published  # the clear travels in this batch
        max_orphans = 0
        for _ in range(10):
            replica.run_for(0.5)
            max_orphans = max(max_orphans, assert_exact(collector, stream, replica))
            checkpoints += 1
        assert record.cleared_in_seq == seq_of_reset
        # Later stores chain onto blocks the reset cleared: their parent is no longer cached.
        orphaned = [
            parent
            for seq, parent, cached in stored_parents
            if seq > seq_of_reset and parent in cached_before and not cached
        ]
        assert orphaned, "a running request should have stored a block after the keep reset"
        assert max_orphans > 0, "the collector should hold the orphaned stores"

        for _ in range(6):
            replica.run_for(3.0)
            assert_exact(collector, stream, replica)
            checkpoints += 1
        assert checkpoints >= 24
        with collector.lock:
            ingest = collector.ingests[stream]
            assert ingest.counters.gaps == 0 and ingest.counters.restarts == 0
            assert ingest.counters.batches_applied == replica.batches_published
            assert ingest.map.counters.clears == 2
        assert [r.mode for r in replica.resets] == [
            ResetMode.DEFAULT,
            ResetMode.PREEMPT,
            ResetMode.KEEP,
        ]
    finally:
        collector.stop()


def test_http_api_is_shaped_like_vllms(replica: LabReplica) -> None:
    """Resets over HTTP are applied by the engine thread between steps; metrics and sources."""
    url = replica.http_url
    assert url is not None
    replica.start()  # its own thread, as fast as it goes
    try:
        time.sleep(0.3)
        reset = f"{url}/reset_prefix_cache"
        status, body = http("POST", f"{reset}?reset_running_requests=true&keep_running_requests=1")
        assert status == 400 and "cannot be combined" in body["detail"]
        status, body = http("POST", f"{url}/reset_prefix_cache?reset_running_requests=maybe")
        assert status == 422
        assert replica.resets == []  # neither reached the engine

        status, body = http("POST", f"{url}/reset_prefix_cache")
        assert status == 200 and set(body) == {"success"}
        default = replica.resets[-1]
        assert default.mode == ResetMode.DEFAULT and default.source == "http"
        assert body["success"] is default.result is (default.held_blocks_before == 0)

        status, body = http("POST", f"{url}/reset_prefix_cache?reset_running_requests=true")
        assert (status, body) == (200, {"success": True})
        preempt = replica.resets[-1]
        assert preempt.mode == ResetMode.PREEMPT and preempt.preempted == preempt.running_before
        assert preempt.running_after == 0

        status, body = http(
            "POST", f"{url}/reset_prefix_cache?keep_running_requests=true&reset_external=true"
        )
        assert (status, body) == (200, {"success": True})
        keep = replica.resets[-1]
        assert keep.mode == ResetMode.KEEP and keep.reset_external
        assert keep.preempted == 0 and keep.running_after == keep.running_before

        assert http("GET", f"{url}/nothing-here")[0] == 404
        assert http("GET", f"{url}/version") == (200, {"version": vllm.__version__})

        time.sleep(0.3)
        with urllib.request.urlopen(f"{url}/metrics", timeout=20) as response:
            assert response.headers["content-type"].startswith("text/plain")
            text = response.read().decode()
        (engine,) = parse_vllm_metrics(text, ts=1.0)
        assert engine.engine == "0"
        assert engine.prefix_cache_queries is not None and engine.prefix_cache_hits is not None
        assert engine.prefix_cache_queries >= engine.prefix_cache_hits > 0
        assert engine.ttft_count is not None and engine.ttft_count > 0
        assert engine.ttft_sum is not None and engine.ttft_sum > 0
        assert list(engine.ttft_buckets)[-1] == math.inf
        assert engine.kv_usage is not None and 0.0 <= engine.kv_usage <= 1.0
        assert engine.running is not None and engine.waiting is not None
        assert engine.preemptions is not None
        assert 'model_name="lab"' in text

        status, sources = http("GET", f"{url}/kv_event_sources")
        assert status == 200 and list(sources) == ["0"]
        assert sources["0"]["endpoint"] == replica.endpoint
        assert sources["0"]["enable_kv_cache_events"] is True
        (spec,) = discover("lab", url)
        assert spec.stream == StreamId("lab", 0)
        assert spec.endpoint == replica.connect_endpoint and not spec.bind
        assert spec.replay_endpoint == replica.replay_connect_endpoint
        assert spec.topic == b"kv-events"
    finally:
        replica.close()
    assert replica.steps > 0 and replica.sim_t > 1.0


def test_a_recording_replays_to_its_ground_truth(tmp_path: Path) -> None:
    """--record: what a SUB socket received, and BlockPool snapshots that the replay equals."""
    capture = tmp_path / "lab.msgpack.gz"
    resets = parse_resets("12:default,24:preempt,36:keep")
    with LabReplica(
        "rec", WorkloadSpec(rate=5.0, seed=3), record=capture, resets=resets, snapshot_every=10
    ) as replica:
        replica.run_for(48)
        last_seq = replica.last_seq
        epoch, end_ts = replica.sim_epoch, replica.ts
    sidecar = json.loads(sidecar_path_for(capture).read_text())
    assert sidecar_path_for(capture) == tmp_path / "lab.json"

    # The file is the capture format: gzip of msgpack [recv_ts, topic, seq(8), payload].
    with gzip.open(capture, "rb") as f:
        head = f.read(2)
    assert head == b"\x94\xcb"  # a 4-element array whose first element is a float64
    records: list[CaptureRecord] = list(read_capture(capture))  # strict about the layout
    assert [r.seq for r in records] == list(range(last_seq + 1))
    assert all(r.topic == b"kv-events" and len(r.seq_frame) == 8 for r in records)
    assert sidecar["subscriber"]["num_missing"] == 0
    assert sidecar["subscriber"]["messages"] == len(records)
    assert sidecar["capture_bytes"] == capture.stat().st_size

    # Batch ts is simulated time (48 s went by in well under a second of wall time).
    stamps = [msgspec.msgpack.decode(r.payload)[0] for r in records]
    assert stamps == sorted(stamps) and epoch <= stamps[0] and stamps[-1] <= end_ts + 1e-6
    assert stamps[-1] - stamps[0] > 30
    assert records[-1].recv_ts - records[0].recv_ts < stamps[-1] - stamps[0]

    # The resets, as the captures' sidecars describe them.
    modes = [(r["mode"], r["requested_sim_t"]) for r in sidecar["resets"]]
    assert modes == [("default", 12.0), ("preempt", 24.0), ("keep", 36.0)]
    for r in sidecar["resets"]:
        assert ("cleared_in_seq" in r) is r["result"]
        assert r["sim_t"] >= r["requested_sim_t"]
    preempt, keep = sidecar["resets"][1], sidecar["resets"][2]
    assert preempt["preempted"] == preempt["running_before"] and preempt["running_after"] == 0
    assert keep["preempted"] == 0 and keep["held_blocks_unchanged"]
    cleared = sidecar["stats"]["all_blocks_cleared_seqs"]
    assert cleared == [r["cleared_in_seq"] for r in sidecar["resets"] if r["result"]]
    assert sidecar["versions"]["vllm"] == vllm.__version__
    assert sidecar["workload"]["rate"] == 5.0 and sidecar["scheduler"]["num_gpu_blocks"] == 400

    # Replayed through the live ingest path, the map equals every settled snapshot.
    labels = {s["label"] for s in sidecar["snapshots"]}
    assert {"periodic-10s", "periodic-40s", "final", "reset2-keep-post-publish"} <= labels
    settled = sorted(
        (s for s in sidecar["snapshots"] if s["pending_events"] == 0),
        key=lambda s: s["published_through_seq"],
    )
    ingest = StreamIngest(StreamId("rec", 0), can_replay=False)
    played = 0
    for snap in settled:
        through = snap["published_through_seq"]
        upto = next((i for i, r in enumerate(records) if r.seq > through), len(records))
        play_into(ingest, records[played:upto])
        played = max(played, upto)
        want = {(h, g): n for h, g, n in snap["hashes"]}
        assert ingest.map.counts() == want, snap["label"]
        assert snap["num_cached_blocks"] == sum(want.values())
    assert len(settled) >= 8
    assert ingest.counters.gaps == 0 and ingest.counters.batches_applied == len(records)


def test_the_lab_command(tmp_path: Path) -> None:
    """`kvscope lab`: two replicas, scheduled resets, recordings, and the report by mode."""
    import typer

    from kvscope.lab.cli import register_lab

    app = typer.Typer()
    register_lab(app)

    @app.callback()
    def main() -> None:  # a group, as in kvscope's app
        pass

    summary = tmp_path / "summary.json"
    result = CliRunner().invoke(
        app,
        [
            "lab",
            "--replicas", "2",
            "--duration", "40",
            "--rate", "4",
            "--resets", "10:default,20:preempt",
            "--reset-every", "15",
            "--mode", "keep",
            "--record", str(tmp_path / "run.msgpack.gz"),
            "--summary-json", str(summary),
        ],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "resets by mode" in result.output and "keep" in result.output
    for name in ("lab0", "lab1"):
        assert (tmp_path / f"run-{name}.msgpack.gz").exists()
        assert (tmp_path / f"run-{name}.json").exists()
    summaries = json.loads(summary.read_text())
    assert [s["name"] for s in summaries] == ["lab0", "lab1"]
    for s in summaries:
        assert s["sim_s"] >= 40
        assert [(r["mode"], r["requested_sim_t"]) for r in s["resets"]] == [
            ("default", 10.0),
            ("keep", 15.0),
            ("preempt", 20.0),
            ("keep", 30.0),
        ]
        assert all(r["result"] for r in s["resets"] if r["mode"] != "default")
        assert 0.0 <= s["idle_fraction"] < 1.0

    # --json: stdout holds one document (the tables' rows), whatever the terminal.
    quiet = CliRunner().invoke(
        app, ["lab", "--duration", "20", "--rate", "3", "--resets", "10:preempt", "--json"]
    )
    assert quiet.exit_code == 0, quiet.output
    document = json.loads(quiet.stdout)
    assert [r["replica"] for r in document["resets"]] == ["lab"]
    assert document["modes"][0]["mode"] == "preempt" and document["replicas"][0]["sim_s"] >= 20

    bad = CliRunner().invoke(app, ["lab", "--resets", "10:sometimes"])
    assert bad.exit_code == 2 and "reset mode" in bad.output


def test_workload_and_schedules() -> None:
    spec = WorkloadSpec(rate=10.0, seed=7, duration=30.0)
    a, b = Workload(spec), Workload(spec)
    first = list(a.due(30.0))
    assert [(r.arrival, r.prompt, r.max_tokens) for r in first] == [
        (r.arrival, r.prompt, r.max_tokens) for r in b.due(30.0)
    ]
    assert 200 < len(first) < 400 and a.next_arrival() is None  # ~10/s for 30 s, then none
    popularity = [sum(r.sys_index == k for r in first) for k in range(spec.num_sys)]
    assert popularity[0] > popularity[-1]  # Zipf-like
    for r in first:
        assert r.prompt[: len(a.system_prompts[r.sys_index])] == a.system_prompts[r.sys_index]
        assert spec.out_len[0] <= r.max_tokens <= spec.out_len[1]
    other = Workload(spec, stream=1)
    assert other.system_prompts == a.system_prompts  # shared prompts, other arrivals
    assert [r.arrival for r in other.due(5.0)] != [r.arrival for r in first if r.arrival <= 5]

    assert parse_resets("90:preempt, 45:default,135:KEEP") == [
        ScheduledReset(45.0, ResetMode.DEFAULT),
        ScheduledReset(90.0, ResetMode.PREEMPT),
        ScheduledReset(135.0, ResetMode.KEEP),
    ]
    assert periodic_resets(60, ResetMode.KEEP, 180) == [
        ScheduledReset(60.0, ResetMode.KEEP),
        ScheduledReset(120.0, ResetMode.KEEP),
    ]
    assert parse_range("32,256") == (32, 256) and parse_range("8") == (8, 8)
    for bad in ("45", "x:keep", "45:never"):
        with pytest.raises(ValueError):
            parse_resets(bad)
    with pytest.raises(ValueError):
        LabReplica("too-small", WorkloadSpec(suffix_len=(32, 4000)))
