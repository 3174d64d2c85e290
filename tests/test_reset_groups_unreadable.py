"""A recovering reset whose log cannot be read (a lost dictionary, a format 6 chunk's named
checkpoint gone) gets no prefix groups, as one whose clear was never stored; unlike that one,
it is said: counted in a metric and logged, and its recovery rows are written all the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscope.api.data import ApiData
from kvscope.api.metrics import make_registry
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.storage.engine import open_store
from kvscope.storage.log_dictionaries_sql import DictionaryUnreadable
from kvscope.storage.prefix_followers import PrefixFollowers
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_store import STREAM


def test_groups_whose_log_cannot_be_read_are_counted_not_hidden(
    tmp_path: Path, monkeypatch: Any
) -> None:
    def unreadable(self: PrefixFollowers, *args: object) -> None:
        # What open_chunk raises once the dictionary a chunk names is gone from the store.
        raise DictionaryUnreadable("log dictionary 00ff of stream 1", "not in the store")

    monkeypatch.setattr(PrefixFollowers, "store", unreadable)
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    assert writer.flush(60)
    registry, _ = make_registry(ApiData(writer=writer))
    unread = registry.get_sample_value("kvscope_store_reset_groups_unreadable_total")
    assert unread is not None and unread > 0
    assert writer.stats.rows_refused == 0  # the recovery rows beside them are written
    writer.close()
