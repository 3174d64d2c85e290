"""A lab recording replays to its ground truth, and the `kvscope lab` command writes one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

# Imported, never importorskip'd: CI installs vLLM, and without it these tests must fail.
import vllm
from typer.testing import CliRunner

from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.types import StreamId
from kvscope.lab.replica import LabReplica
from kvscope.lab.sidecar import sidecar_path_for
from kvscope.lab.workload import (
    WorkloadSpec,
    parse_resets,
)

pytestmark = pytest.mark.vllm

SYNC_TIMEOUT_S = 10.0
BLOCK = 16


def test_a_recording_replays_to_its_ground_truth(tmp_path: Path) -> None:
    """--record: what a SUB socket received, and BlockPool snapshots that the replay equals."""
    capture = tmp_path / "lab.msgpack.gz"
    resets = parse_resets("12:default,24:preempt,36:keep")
    with LabReplica(
        "rec", WorkloadSpec(rate=5.0, seed=3), record=capture, resets=resets, snapshot_every=10
    ) as replica:
        replica.run_for(48)
        last_seq = replica.last_seq
        assert last_seq is not None
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
            "--replicas",
            "2",
            "--duration",
            "40",
            "--rate",
            "4",
            "--resets",
            "10:default,20:preempt",
            "--reset-every",
            "15",
            "--mode",
            "keep",
            "--record",
            str(tmp_path / "run.msgpack.gz"),
            "--summary-json",
            str(summary),
        ],
        env={"COLUMNS": "200"},
    )
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
