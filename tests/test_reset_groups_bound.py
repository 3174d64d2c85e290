"""The prefix followers are bounded by memory, not by count (storage/prefix_followers.py): a
fleet's resets in flight are all followed while their maps fit in `prefix_follower_bytes`;
past it the followers not held are counted and their answers computed in full, each still the
one `reset_prefixes` reads from the store."""

from __future__ import annotations

from typing import Any

from kvscope.api.data import ApiData
from kvscope.api.metrics import make_registry
from kvscope.collector._slot_map import SlotMap
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.reset_follower import (
    BEFORE_GROUP_BYTES,
    CHILD_BYTES,
    FOLLOWED_BLOCK_BYTES,
    TABLE_BYTES,
)
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, store
from tests.test_reset_groups_follow import Checked

FLEET = 80
"""More replicas in recovery at once than the count cap of 64 that came before."""
BATCHES = [
    (0, 100.0, [store(1, 2, 3), store(7, parent=1)]),
    (1, 101.0, [CLEAR, store(1)]),
    (2, 101.5, [store(2, parent=1)]),
    (3, 103.5, [store(3, parent=2)]),  # past +1 s and +2 s: the first recovery row
    (4, 106.5, [store(9)]),  # past +5 s
]
FOLLOWER_BYTES = (
    SlotMap().nbytes() + BEFORE_GROUP_BYTES + TABLE_BYTES + 3 * (FOLLOWED_BLOCK_BYTES + CHILD_BYTES)
)
"""What each follower holds at its last answer: a `before` map of 4 blocks in one group (its
marks a slot map of the smallest size), 3 of them back in one table, each recorded under its
parent (block 9 is stored after the last offset reached)."""


def _fleet(tmp_path: Any, **settings: Any) -> tuple[StoreWriter, Checked]:
    writer = StoreWriter(
        open_store(f"sqlite:///{tmp_path / 'fleet.sqlite'}"),
        StoreSettings(rows_per_transaction=1, **settings),
    )
    checked = Checked(writer._sql.followers)
    writer._sql.followers.observe = checked
    ingests = [
        StreamIngest(StreamId(f"r{i}", 0), can_replay=False, sink=writer) for i in range(FLEET)
    ]
    for seq, ts, events in BATCHES:  # the replicas in step: all recovering at once
        for ingest in ingests:
            ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    assert writer.flush(60)
    return writer, checked


def test_a_fleets_resets_in_flight_are_all_followed(tmp_path: Any) -> None:
    writer, checked = _fleet(tmp_path)
    followers = writer._sql.followers
    assert checked.wrong == [] and len(checked.answers) >= 2 * FLEET
    assert followers.held() == FLEET
    assert followers.turned_away == 0
    assert followers.follower_bytes() == FLEET * FOLLOWER_BYTES
    writer.close()


def test_past_the_memory_bound_followers_are_turned_away_and_counted(tmp_path: Any) -> None:
    room = 30
    writer, checked = _fleet(tmp_path, prefix_follower_bytes=room * FOLLOWER_BYTES)
    followers = writer._sql.followers
    assert checked.wrong == []  # those not held are answered in full: the same answers
    assert followers.held() == room
    assert followers.follower_bytes() <= room * FOLLOWER_BYTES
    # Every stream not held was turned away at its last answer at least; their later answers
    # came from followers made afresh.
    assert followers.turned_away >= FLEET - room
    assert followers.rebuilt > FLEET
    # What an operator sees: the followers held, and the answers turned away.
    registry, _ = make_registry(ApiData(writer=writer))
    assert registry.get_sample_value("kvscope_store_reset_followers") == room
    turned = registry.get_sample_value("kvscope_store_reset_followers_turned_away_total")
    assert turned == followers.turned_away
    writer.close()


def test_a_count_cap_still_holds_when_set(tmp_path: Any) -> None:
    writer, checked = _fleet(tmp_path, prefix_followers=5)
    assert checked.wrong == [] and writer._sql.followers.held() == 5
    assert writer._sql.followers.turned_away > 0
    writer.close()
