"""A reset's recovery survives a kill -9: the resumed writer follows the windows still open in
the store, and its rows equal those of a run that was never interrupted."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import delete, update

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.resume import resume_point
from kvscope.storage.writer import StoreWriter
from tests.test_recovery_live import STREAM, capture, stored_recovery

# Cuts (records applied before the kill): just after the first clear (seq 1055), within its
# window between two offsets, a few batches after the second clear (seq 1592), near the end.
CUTS = (1058, 1240, 1600, 2100)

Rows = list[tuple[Any, ...]]  # stored_recovery's


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Rows, Rows]:
    """The uninterrupted run: rows while the stream is open, and after close."""
    url = f"sqlite:///{tmp_path_factory.mktemp('straight') / 's.sqlite'}"
    writer = StoreWriter(open_store(url))
    play_into(StreamIngest(STREAM, can_replay=False, sink=writer), capture())
    assert writer.flush()
    open_rows = stored_recovery(writer.engine)
    writer.close()
    return open_rows, stored_recovery(writer.engine)


@pytest.mark.parametrize("cut", CUTS)
def test_rows_after_kill_9_and_resume_equal_an_uninterrupted_run(
    store_url: str, cut: int, straight: tuple[Rows, Rows]
) -> None:
    records = capture()
    engine = open_store(store_url)
    first = StoreWriter(engine)
    play_into(StreamIngest(STREAM, can_replay=False, sink=first), records[:cut])
    assert first.flush()  # what reached the store; then the process dies: no close()

    point = resume_point(engine, STREAM)
    assert point is not None and point.last_seq == records[cut - 1].seq
    second = StoreWriter(engine)
    second.resumed(point)
    ingest = StreamIngest(STREAM, can_replay=False, sink=second)
    ingest.resume(point)
    play_into(ingest, records[cut:])
    assert second.flush()
    assert stored_recovery(engine) == straight[0]
    second.close()
    assert stored_recovery(engine) == straight[1]


def test_rows_lost_with_the_crash_are_rebuilt_from_the_log(
    store_url: str, straight: tuple[Rows, Rows]
) -> None:
    """A store whose recovery rows lag its log (written by an older kvscope, or lost) is put
    right at resume: the open window is recomputed from the stored batches."""
    records = capture()
    engine = open_store(store_url)
    first = StoreWriter(engine)
    play_into(StreamIngest(STREAM, can_replay=False, sink=first), records[:1400])
    assert first.flush()
    with engine.begin() as conn:
        conn.execute(delete(schema.reset_recovery))
        conn.execute(update(schema.resets).values(t50_s=None, t90_s=None, peak_orphans=None))

    point = resume_point(engine, STREAM)
    assert point is not None
    second = StoreWriter(engine)
    second.resumed(point)
    ingest = StreamIngest(STREAM, can_replay=False, sink=second)
    ingest.resume(point)
    play_into(ingest, records[1400:])
    second.close()
    assert stored_recovery(engine) == straight[1]
