"""Issue 12's fuzz harness, a short run of it (scripts/fuzz.py runs the long ones).

Live: `kvscope serve` as a subprocess, fed the bundled capture on two replicas through real ZMQ
sockets, with seeded hostile messages of every class interleaved into one (kvscope/fuzz/). After
it the process must be alive and ready, both streams read to their last seq, the honest map
equal the capture's alone, the hostile map equal the offline oracle of the same frames (and the
capture's alone when every taint came before the capture's last clear, else be degraded),
malformed counts by kind equal the oracle's, no traceback in serve's log, exit 0 on SIGTERM.

Offline (hypothesis, no sockets): whatever the seed, every hostile message leaves a trace in
the stream's counters, nothing escapes the ingest, and the honest batch after it applies.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.fuzz.checks import summary
from kvscope.fuzz.frames import CLASSES, FrameFactory, SeqRule
from kvscope.fuzz.live import BUNDLED, FuzzOptions, run_fuzz
from kvscope.fuzz.msgpack_raw import Raw, pack, pack_int

HOSTILE_PER_BATCH = 4


@cache
def records() -> list[CaptureRecord]:
    return list(read_capture(BUNDLED))


def _trace(ingest: StreamIngest) -> tuple[int, ...]:
    c = ingest.counters
    return (c.batches_applied, c.malformed.total(), c.duplicates, c.restarts, c.gaps)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), start=st.integers(0, 2000))
def test_every_hostile_message_leaves_a_trace_and_the_next_batch_is_taken(
    seed: int, start: int
) -> None:
    honest = records()[start : start + 30]
    factory = FrameFactory(records(), seed, jump_past=10**6)
    ingest = StreamIngest(StreamId("hostile", 0), can_replay=False)
    next_seq, last = 0, None
    for record in honest:
        for _ in range(HOSTILE_PER_BATCH):
            hostile = factory.make(next_seq, last)
            before = _trace(ingest)
            ingest.live_frames(hostile.frames, 0.0)
            assert _trace(ingest) != before, hostile
            if hostile.rule is SeqRule.NEXT:
                last, next_seq = (next_seq, hostile.frames[2]), next_seq + 1
        applied, back = ingest.counters.batches_applied, ingest.counters.malformed["seq_back"]
        ingest.live_frames([record.topic, next_seq.to_bytes(8, "big"), record.payload], 0.0)
        # Applied, or (after a hostile seq sent the stream far ahead, and a restart was just
        # taken) refused as a seq that went back again too soon: no restart storm.
        refused = ingest.counters.malformed["seq_back"] == back + 1
        assert refused or (
            ingest.last_seq == next_seq and ingest.counters.batches_applied == applied + 1
        )
        last, next_seq = (next_seq, record.payload), next_seq + 1


def test_the_frames_are_the_seeds() -> None:
    def made(seed: int) -> list[list[bytes]]:
        factory = FrameFactory(records(), seed, jump_past=10**6)
        return [factory.make(n, (n - 1, b"x") if n else None).frames for n in range(300)]

    assert made(7) == made(7) != made(8)


def test_the_raw_writer_writes_what_no_encoder_would() -> None:
    assert pack_int(2**64 - 1) == b"\xcf" + b"\xff" * 8 and pack_int(
        -(2**63)
    ) == b"\xd3\x80" + bytes(7)
    assert pack([Raw(b"\xa1\xff"), None]) == b"\x92\xa1\xff\xc0"  # a str of invalid UTF-8


def _run(tmp_path: Path, **options: object) -> None:
    settings = FuzzOptions(
        workdir=tmp_path,
        timeout_s=180,
        max_rss_growth_mib=400,
        drain_s=20,
        log=lambda line: None,
        **options,  # type: ignore[arg-type]
    )
    result = run_fuzz(settings)
    report = summary(result)
    assert result.failures == [], report
    assert set(result.tally.sent) == set(CLASSES), report
    assert result.tally.honest_messages == len(records())
    assert sum(result.malformed["hostile"].values()) >= result.tally.sent.total() // 2, report


def test_hostile_frames_before_the_last_clear_leave_the_map_exact(tmp_path: Path) -> None:
    # Every taint comes before the capture's last AllBlocksCleared: the hostile replica's map
    # must end equal to the honest one, and known.
    _run(tmp_path, frames=1_500, seed=12, until_last_clear=True)


def test_hostile_frames_anywhere_leave_the_map_degraded_or_exact(tmp_path: Path) -> None:
    _run(tmp_path, frames=1_500, seed=13)
