"""Recorded streams of vLLM's real scheduler, replayed and compared with its own BlockPool."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.collector.capture import CaptureError, read_capture, write_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import ClearedMap, ClearReason, NullSink
from kvscope.collector.types import StreamId
from tests.conftest import capture_path

CAPTURES = ["lab_3rps_180s", "lab_10rps_300s"]


def settled_snapshots(sidecar: dict[str, Any]) -> list[dict[str, Any]]:
    snapshots = [s for s in sidecar["snapshots"] if s["pending_events"] == 0]
    return sorted(snapshots, key=lambda s: s["published_through_seq"])


@pytest.mark.parametrize("name", CAPTURES)
def test_map_equals_every_blockpool_snapshot(name: str) -> None:
    capture = capture_path(f"{name}.msgpack.gz")
    sidecar = json.loads(capture.with_name(f"{name}.json").read_text())
    snapshots = settled_snapshots(sidecar)
    cleared: list[ClearedMap] = []

    class Keep(NullSink):
        def map_cleared(self, c: ClearedMap) -> None:
            cleared.append(c)

    ingest = StreamIngest(StreamId("lab", 0), can_replay=False, sink=Keep())
    checked = 0

    def check_through(limit: int | None) -> None:
        nonlocal checked
        while snapshots and (limit is None or snapshots[0]["published_through_seq"] < limit):
            snap = snapshots.pop(0)
            want = {(h, g): n for h, g, n in snap["hashes"]}
            assert ingest.map.counts() == want, snap["label"]
            checked += 1

    for record in read_capture(capture):
        check_through(record.seq)
        ingest.live_frames(record.frames, record.recv_ts)
    check_through(None)
    assert checked >= 10
    assert ingest.degraded is None and ingest.counters.gaps == 0

    # Each successful reset's "before" handed to listeners is the pre-reset snapshot.
    by_label = {s["label"]: s for s in sidecar["snapshots"]}
    resets = [r for r in sidecar["resets"] if r["result"]]
    assert [c.reason for c in cleared] == [ClearReason.ALL_BLOCKS_CLEARED] * len(resets)
    for reset, before in zip(resets, cleared, strict=True):
        assert before.seq == reset["cleared_in_seq"]
        pre = by_label[next(label for label in reset["snapshots"] if label.endswith("-pre"))]
        got = {(h, k.group): n for k, t in before.tables.items() for h, n in t.counts().items()}
        assert got == {(h, g): n for h, g, n in pre["hashes"]}


def test_keep_resets_make_orphans_that_rejoin_or_leave() -> None:
    capture = capture_path("lab_10rps_300s.msgpack.gz")
    ingest = StreamIngest(StreamId("lab", 0), can_replay=False)
    max_orphans = 0
    for record in read_capture(capture):
        ingest.live_frames(record.frames, record.recv_ts)
        max_orphans = max(max_orphans, ingest.map.totals().orphans)
    assert max_orphans > 0
    totals = ingest.map.totals()
    assert totals.hittable <= totals.blocks


def test_replay_command_dumps_the_map_at_chosen_seqs(tmp_path: Path) -> None:
    capture = capture_path("lab_3rps_180s.msgpack.gz")
    sidecar = json.loads(capture.with_name("lab_3rps_180s.json").read_text())
    snaps = settled_snapshots(sidecar)[:3]
    seqs = [int(s["published_through_seq"]) for s in snaps]
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(capture),
            "--replica",
            "lab",
            "--dump-at",
            ",".join(map(str, seqs)),
            "--dump-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    for seq, snap in zip(seqs, snaps, strict=True):
        lines = [json.loads(x) for x in (tmp_path / f"{seq}.jsonl").read_text().splitlines()]
        assert {(x["hash"], x["group"]): x["count"] for x in lines} == {
            (h, g): n for h, g, n in snap["hashes"]
        }
        assert all(x["medium"] == "GPU" for x in lines)
        assert set(lines[0]) == {"hash", "group", "medium", "count", "parent", "hittable"}
        parents = {x["hash"]: x["parent"] for x in lines}

        def reachable(block: object, parents: dict[object, object] = parents) -> bool:
            while block is not None:
                if block not in parents:
                    return False
                block = parents[block]
            return True

        assert all(x["hittable"] == reachable(x["hash"]) for x in lines)


def test_replay_command_refuses_bad_flags(tmp_path: Path) -> None:
    capture = capture_path("lab_3rps_180s.msgpack.gz")
    runner = CliRunner()
    bad = runner.invoke(app, ["replay", str(capture), "--dump-at", "x,1", "--dump-dir", "d"])
    assert bad.exit_code == 2 and "--dump-at" in bad.output
    missing = runner.invoke(app, ["replay", str(capture), "--dump-at", "5"])
    assert missing.exit_code == 2 and "--dump-dir" in missing.output
    garbage = tmp_path / "x.gz"
    garbage.write_bytes(b"not gzip")
    assert runner.invoke(app, ["replay", str(garbage)]).exit_code == 2


def test_a_capture_cut_short_or_corrupt_raises_one_error_after_what_it_holds(
    tmp_path: Path,
) -> None:
    good = capture_path(f"{CAPTURES[0]}.msgpack.gz")
    records = list(read_capture(good))
    raw = gzip.decompress(good.read_bytes())
    # Where the 101st record starts: the 100 before it decode whole.
    written = tmp_path / "first.msgpack.gz"
    write_capture(written, records[:100])
    cut_at = len(gzip.decompress(written.read_bytes()))
    cases = {
        "record cut": (gzip.compress(raw[: cut_at + 7]), 100),
        "record cut in its payload": (gzip.compress(raw[: cut_at + 40]), 100),
        "gzip cut": (gzip.compress(raw)[: len(gzip.compress(raw)) // 2], None),
        "not a record": (gzip.compress(raw[:cut_at] + b"\x93" + raw[cut_at + 1 :]), 100),
        "a field of a wrong type": (gzip.compress(raw[:cut_at] + b"\x94\xa1x" + raw[cut_at:]), 100),
        "not gzip": (raw[:1000], 0),
    }
    for name, (data, where) in cases.items():
        path = tmp_path / f"{name}.msgpack.gz"
        path.write_bytes(data)
        read = []
        with pytest.raises(CaptureError) as caught:
            for record in read_capture(path):
                read.append(record)
        assert caught.value.records == len(read), name
        assert read == records[: len(read)], name
        if where is not None:
            assert len(read) == where, name
        else:
            assert 0 < len(read) < len(records), name
