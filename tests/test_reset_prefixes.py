"""What came back of a reset, prefix by prefix (storage/reset_prefixes.py), against the live
map: the bundled recording is played through the live ingest path into a store, while a probe
sink beside the writer looks at the live map itself (before each batch, and after each one);
the groups, their counts at each offset and the orphans computed from the store afterwards
are the probe's, hash for hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from kvscope.collector.block_table import BlockTable
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import (
    EVERY_BATCH,
    AppliedBatch,
    ClearedMap,
    FanOut,
    MapReader,
    NullSink,
    Span,
)
from kvscope.collector.types import StreamId, TableKey
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.recovery import DEFAULT_OFFSETS_S
from kvscope.storage.reset_prefix_types import BACK_SHARE, status_of
from kvscope.storage.reset_prefixes import PrefixesCache, reset_prefixes
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)
Hashes = dict[TableKey, dict[int, bool]]
"""Per table: every cached hash and whether it is hittable."""


def _cached(view: MapReader) -> Hashes:
    return {
        key: {h: table.is_hittable(h) for h in table.counts()} for key, table in view.tables.items()
    }


def _orphan_heads(view: MapReader) -> set[tuple[TableKey, int]]:
    heads: set[tuple[TableKey, int]] = set()
    for key, table in view.tables.items():
        assert isinstance(table, BlockTable)
        heads.update((key, t.head) for t in table.subtrees() if t.orphan)
    return heads


@dataclass
class Watched:
    ts: float
    groups: dict[tuple[TableKey, int], tuple[set[int], set[int], int]]
    """(table, root) -> its blocks, its shared blocks, its block size."""
    at: dict[float, Hashes] = field(default_factory=dict)
    """offset -> the live map at reset ts + offset."""
    orphans: dict[tuple[TableKey, int], list[float | None]] = field(default_factory=dict)
    """(table, hash) -> [became an orphan, stopped being one], as the live map shows it."""


def _groups(tables: Any) -> dict[tuple[TableKey, int], tuple[set[int], set[int], int]]:
    """Roots by walking parents one hash at a time; shared blocks by walking up from each leaf."""
    out: dict[tuple[TableKey, int], tuple[set[int], set[int], int]] = {}
    for key, table in tables.items():
        cached = set(table.counts())
        parents = {h: table.parent_of(h) for h in cached}
        leaves_under = dict.fromkeys(cached, 0)
        has_child = {p for h, p in parents.items() if p in cached}
        for leaf in cached - has_child:
            h: int | None = leaf
            while h in cached:
                leaves_under[h] += 1
                h = parents[h]
        for start in cached:
            h = start
            while parents[h] in cached:
                h = parents[h]
            blocks, shared, _ = out.setdefault((key, h), (set(), set(), table.block_size))
            blocks.add(start)
            if leaves_under[start] >= 2:
                shared.add(start)
    return out


class Probe(NullSink):
    """The live map at every offset after each clear, and its orphans after every batch."""

    def __init__(self) -> None:
        self.resets: dict[int, Watched] = {}
        self._current: Watched | None = None

    def map_cleared(self, cleared: ClearedMap) -> None:
        self._current = self.resets[cleared.seq] = Watched(cleared.ts, _groups(cleared.tables))

    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        watched = self._current
        if watched is not None:
            for offset in DEFAULT_OFFSETS_S:
                if offset not in watched.at and ts > watched.ts + offset:
                    watched.at[offset] = _cached(view)
        return EVERY_BATCH

    def applied(self, batch: AppliedBatch) -> None:
        watched = self._current
        if watched is None:
            return
        heads = _orphan_heads(batch.view)
        for head in heads:
            span = watched.orphans.get(head)
            if span is None or span[1] is not None:
                watched.orphans.setdefault(head, [batch.ts, None])
        for head, span in watched.orphans.items():
            if span[1] is None and head not in heads:
                span[1] = batch.ts


def _played(url: str) -> tuple[Any, Probe]:
    writer = StoreWriter(open_store(url))
    probe = Probe()
    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(writer, probe))
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    return writer.engine, probe


def test_groups_and_orphans_are_the_live_maps_hash_for_hash(store_url: str) -> None:
    engine, probe = _played(store_url)
    with engine.connect() as conn:
        resets = conn.execute(select(schema.resets).order_by(schema.resets.c.seq)).all()
        computed = {row.seq: reset_prefixes(conn, row.id) for row in resets}
    assert sorted(computed) == sorted(probe.resets) == [1055, 1592]
    statuses = []
    for seq, answer in computed.items():
        watched = probe.resets[seq]
        # Only the offsets the store reached: the recording ends 45 s after each reset.
        assert answer.offsets == (1.0, 2.0, 5.0, 10.0, 20.0, 30.0) and not answer.complete
        assert {(g.table, g.root) for g in answer.groups} == set(watched.groups)
        assert [g.tokens for g in answer.groups] == sorted(
            (g.tokens for g in answer.groups), reverse=True
        )
        for group in answer.groups:
            blocks, shared, block_size = watched.groups[(group.table, group.root)]
            assert (group.blocks, group.tokens) == (len(blocks), len(blocks) * block_size)
            assert group.shared_blocks == len(shared)
            expected = []
            for offset in answer.offsets:
                live = watched.at[offset].get(group.table, {})
                back = [h for h in blocks if h in live]
                expected.append(
                    (
                        offset,
                        len(back),
                        sum(live[h] for h in back),
                        sum(live[h] for h in back if h in shared),
                    )
                )
            assert [
                (p.offset_s, p.blocks_back, p.hittable_back, p.shared_back) for p in group.points
            ] == expected
            trunk = len(shared) or len(blocks)
            back_at = next(
                (o for o, _, hit, sh in expected if (sh if shared else hit) >= BACK_SHARE * trunk),
                None,
            )
            assert group.back_at_s == back_at and group.status == status_of(back_at)
            statuses.append(group.status)
        # Orphans: every block the live map showed as an orphan head within the window
        # followed (to the last offset reached), with when it rejoined or went.
        until = watched.ts + answer.offsets[-1]
        live_orphans = {
            head: (span[0], span[1] if span[1] is not None and span[1] <= until else None)
            for head, span in watched.orphans.items()
            if span[0] <= until  # type: ignore[operator]
        }
        assert {
            (o.table, o.hash): (o.stored_ts, o.rejoined_ts or o.removed_ts) for o in answer.orphans
        } == live_orphans
    # The lab's shared system prompts come back; the keep-mode reset (the second) left orphans.
    assert "back at +1 s" in statuses and "back at +10 s" in statuses
    assert computed[1592].orphans and not computed[1055].orphans
    assert all(o.group_root is not None for o in computed[1592].orphans)


def test_status_buckets() -> None:
    assert [status_of(s) for s in (None, 1.0, 2.0, 10.0, 20.0, 60.0, 120.0, 300.0)] == [
        "not back",
        "back at +1 s",
        "back at +10 s",
        "back at +10 s",
        "back at +60 s",
        "back at +60 s",
        "back later",
        "back later",
    ]


def test_the_cache_answers_again_until_more_is_reached(tmp_path: Any) -> None:
    engine, _ = _played(f"sqlite:///{tmp_path / 's.sqlite'}")
    cache = PrefixesCache()
    rr = schema.reset_recovery
    with engine.connect() as conn:
        first = cache.get(conn, 1)
        assert cache.get(conn, 1) is first
    with engine.begin() as conn:  # a point more reached since
        conn.execute(
            rr.insert().values(
                reset_id=1,
                offset_s=60.0,
                blocks=1,
                hittable=1,
                orphans=0,
                share_blocks_back=0.0,
                share_tokens_back=0.0,
            )
        )
    with engine.connect() as conn:
        again = cache.get(conn, 1)
        assert again is not first and again.offsets[-1] == 60.0
        assert len(again.groups[0].points) == len(first.groups[0].points) + 1


def test_the_api_pages_the_groups_and_says_partial(tmp_path: Any) -> None:
    from fastapi.testclient import TestClient

    from kvscope.api.app import create_app
    from kvscope.api.data import ApiData
    from kvscope.collector.wire import BatchDecoder

    records = list(read_capture(capture_path("lab_3rps_180s.msgpack.gz")))
    decoder = BatchDecoder()
    stamps = [float(decoder.decode(r.payload, r.seq).ts) for r in records]
    clear_ts = stamps[next(i for i, r in enumerate(records) if r.seq == 1055)]
    head = sum(1 for ts in stamps if ts <= clear_ts + 12.0)
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in records[:head]:
        ingest.live_frames(record.frames, record.recv_ts)
    assert writer.flush()
    client = TestClient(create_app(ApiData(engine=writer.engine, writer=writer)))

    # Mid-stream: the first reset's recovery reached +10 s; the answer says partial.
    early = client.get("/resets/1/prefixes").json()
    assert early["offsets_reached"] == [1.0, 2.0, 5.0, 10.0]
    assert early["recovery_complete"] is False
    assert all(len(g["points"]) == 4 for g in early["items"])

    for record in records[head:]:
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    whole = client.get("/resets/1/prefixes", params={"limit": 10_000}).json()
    assert whole["offsets_reached"] == [1.0, 2.0, 5.0, 10.0, 20.0, 30.0]  # computed again
    assert whole["recovery_complete"] is False  # the next reset cut it short
    assert whole["unknown_because"] == []
    items = whole["items"]
    assert whole["next_cursor"] is None and len(items) == whole["groups_total"] >= 2
    assert [g["tokens"] for g in items] == sorted((g["tokens"] for g in items), reverse=True)
    assert whole["tokens_total"] == sum(g["tokens"] for g in items)
    assert sum(whole["tokens_by_status"].values()) == whole["tokens_total"]
    for group in items:
        assert group["tokens"] == 16 * group["blocks"]
        assert group["first_tokens"] is not None and len(group["first_tokens"]) == 16
        assert [p["offset_s"] for p in group["points"]] == whole["offsets_reached"]
        assert group["root_text"] == str(group["root"])
    # A page at a time, by cursor, gives the same groups.
    paged, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1} | ({} if cursor is None else {"cursor": cursor})
        answer = client.get("/resets/1/prefixes", params=params).json()
        assert len(answer["items"]) == 1
        paged += answer["items"]
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert paged == items
    keep = client.get("/resets/2/prefixes").json()
    assert keep["orphans_total"] == len(keep["orphans"]) >= 1
    roots = {g["root"] for g in keep["items"]}
    assert all(o["group_root"] in roots for o in keep["orphans"])
    assert sum(g["orphans_left"] for g in keep["items"]) == keep["orphans_total"]

    missing = client.get("/resets/999/prefixes")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_reset"
    bad = client.get("/resets/1/prefixes", params={"cursor": "x"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "cursor"
    assert "/resets/{reset_id}/prefixes" in client.get("/openapi.json").json()["paths"]
