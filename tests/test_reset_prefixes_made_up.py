"""What came back of a reset, prefix by prefix (storage/reset_prefixes.py), on hand-made
streams: groups, a keep-running reset's orphans rejoining their chain, a restart, and blocks
orphaned later by their parent's eviction, counted apart."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from kvscope.collector.ingest import StreamIngest
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.writer import StoreWriter
from tests.test_reset_prefixes import STREAM


def test_a_made_up_stream_groups_orphans_rejoining_and_a_restart(tmp_path: Any) -> None:
    """Before the clear: 1-2-3 and 1-2-4 (1 and 2 shared), and 20-21 (a single chain). The
    clear's batch stores 5 under the cleared 3 (an orphan, as after a keep-running reset),
    which rejoins when 3 is stored again. Then the engine restarts."""
    from tests.test_ingest import CLEAR, frames, payload, remove, store

    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    batches = [
        (0, 100.0, [store(1, 2, 3), store(4, parent=2), store(20, 21)]),
        (1, 101.0, [CLEAR, store(5, parent=3)]),
        (2, 101.5, [store(1, 2)]),
        (3, 103.0, [store(3, parent=2)]),
        (4, 106.0, [store(20)]),
        (5, 112.0, [store(21, parent=20)]),
        (6, 125.0, [remove(4)]),
        # The engine restarts: seq 0 again.
        (0, 200.0, [store(1, 2, 3, 5)]),
        (1, 202.0, [store(20)]),
        (2, 210.0, [store(30)]),
    ]
    for seq, ts, events in batches:
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    with writer.engine.connect() as conn:
        ids = conn.execute(select(schema.resets.c.id).order_by(schema.resets.c.id)).scalars()
        clear, restart = (reset_prefixes(conn, rid) for rid in ids)
    assert clear.offsets == (1.0, 2.0, 5.0, 10.0, 20.0)
    a, b = clear.groups
    assert (a.root, a.blocks, a.tokens, a.shared_blocks) == (1, 4, 64, 2)
    assert [(p.blocks_back, p.hittable_back, p.shared_back) for p in a.points] == [
        (2, 2, 2),
        (3, 3, 2),
        (3, 3, 2),
        (3, 3, 2),
        (3, 3, 2),
    ]
    assert (a.back_at_s, a.status, a.orphans_left) == (1.0, "back at +1 s", 1)
    assert (b.root, b.blocks, b.shared_blocks) == (20, 2, 0)
    # +5 s is 106: the batch stamped 106 is in.
    assert [(p.blocks_back, p.hittable_back) for p in b.points] == [
        (0, 0),
        (0, 0),
        (1, 1),
        (1, 1),
        (2, 2),
    ]
    assert (b.back_at_s, b.status) == (20.0, "back at +60 s")  # all of a single chain
    (orphan,) = clear.orphans
    assert (orphan.hash, orphan.parent, orphan.stored_ts) == (5, 3, 101.0)
    assert (orphan.rejoined_ts, orphan.removed_ts, orphan.group_root) == (103.0, None, 1)
    assert clear.followed_until_ts == 112.0  # the last batch at or before +20 s

    # The restart: its before map (1-2-3-5 and 20-21, 4 removed), followed in the new epoch.
    assert restart.offsets == (1.0, 2.0, 5.0)
    a, b = restart.groups
    assert (a.root, a.blocks, a.shared_blocks) == (1, 4, 0)
    assert [p.hittable_back for p in a.points] == [4, 4, 4] and a.status == "back at +1 s"
    assert [p.hittable_back for p in b.points] == [0, 1, 1] and b.status == "not back"
    assert restart.orphans == ()


def test_blocks_orphaned_later_by_eviction_are_counted_apart(tmp_path: Any) -> None:
    """After a preempting reset (nothing stored under a cleared parent), 1-2-3 and 1-2-4 come
    back hittable; then 2 is evicted before 3 and 4 (both become orphans: not the reset's), 4
    is removed, 2 is stored again (3 rejoins). In one batch 7 is stored under 6 and 6 removed:
    7 was stored under a cached parent, so it too is orphaned by eviction, not by the reset.
    A keep-running reset's orphan (9 under the cleared 8) stays the reset's."""
    from tests.test_ingest import CLEAR, frames, payload, remove, store

    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    batches = [
        (0, 100.0, [store(1, 2, 3), store(4, parent=2), store(8)]),
        (1, 101.0, [CLEAR, store(9, parent=8)]),
        (2, 101.5, [store(1, 2, 3), store(4, parent=2), store(6)]),
        (3, 103.0, [remove(2)]),
        (4, 104.0, [remove(4)]),
        (5, 105.0, [store(2, parent=1), store(7, parent=6), remove(6)]),
        (6, 130.0, [store(10)]),
    ]
    for seq, ts, events in batches:
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    with writer.engine.connect() as conn:
        found = reset_prefixes(conn, 1)
    assert [(o.hash, o.parent, o.stored_ts) for o in found.orphans] == [(9, 8, 101.0)]
    evicted = {o.hash: o for o in found.evicted_orphans}
    assert sorted(evicted) == [3, 4, 7]
    three, four, seven = evicted[3], evicted[4], evicted[7]
    assert (three.parent, three.stored_ts, three.rejoined_ts, three.removed_ts) == (
        2,
        103.0,
        105.0,
        None,
    )
    assert (four.stored_ts, four.rejoined_ts, four.removed_ts) == (103.0, None, 104.0)
    assert (seven.parent, seven.stored_ts, seven.rejoined_ts) == (6, 105.0, None)
    assert three.group_root == four.group_root == 1 and seven.group_root is None
    # Not the reset's: the groups' orphans_left count the reset's only.
    assert sum(g.orphans_left for g in found.groups) == 1

    from fastapi.testclient import TestClient

    from kvscope.api.app import create_app
    from kvscope.api.data import ApiData

    answer = TestClient(create_app(ApiData(engine=writer.engine))).get("/resets/1/prefixes")
    shown = answer.json()
    assert (shown["orphans_total"], shown["evicted_orphans_total"]) == (1, 3)
    assert [
        (o["hash"], o["orphaned_ts"], o["rejoined_ts"], o["removed_ts"])
        for o in shown["evicted_orphans"]
    ] == [(3, 103.0, 105.0, None), (4, 103.0, None, 104.0), (7, 105.0, None, None)]
