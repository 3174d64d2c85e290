"""storage/reset_orphans.py looks, at each batch, only at the open orphans the batch's events
name: it finds what a scan of every open orphan at every batch (as it did before) finds, on
random streams of stores, removals and clears. And its batch step in Cython
(storage/_reset_orphans.pyx) finds what the same step in Python (as it was before) found, and
records as many children, on hashes with the high bits set too (the Python step's own record
of what was stored under what is its reference, not the compiled one's). Its records, asked
for after every batch (as a follower answers at every offset) and kept while no entry changed,
are those made anew each time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    StreamId,
    TableKey,
)
from kvscope.storage.reset_orphans import Orphans
from kvscope.storage.reset_prefix_types import ResetOrphan

KEYS = (TableKey("GPU", 0), TableKey("CPU", 0))


class FullScanOrphans(Orphans):
    """Every open entry checked at every batch, as before the index."""

    def _rejoined_or_removed(
        self,
        view: PrefixMap,
        removed: dict[TableKey, set[int]],
        stored: list[tuple[TableKey, list[int]]],
        cleared: bool,
        ts: float,
    ) -> None:
        for entry in list(self._open.values()):
            self._settle(view, entry, ts)


def _python_add_chain(
    under: dict[int, int | set[int]], parent: int | None, hashes: Sequence[int]
) -> None:
    """`add_chain` in Python, as before storage/_reset_orphans.pyx."""
    for h in hashes:
        if parent is not None:
            kids = under.get(parent)
            if kids is None:
                under[parent] = h
            elif isinstance(kids, int):
                if kids != h:
                    under[parent] = {kids, h}
            else:
                kids.add(h)
        parent = h


class FreshRecords(Orphans):
    """Its records made anew at every answer, as before they were kept."""

    def result(self) -> tuple[ResetOrphan, ...]:
        return self._records(self.found)

    def evicted_result(self) -> tuple[ResetOrphan, ...]:
        return self._records(self.evicted)


class PythonOrphans(Orphans):
    """`after` in Python, as before storage/_reset_orphans.pyx."""

    def after(self, view: PrefixMap, events: Iterable[KVEvent], ts: float) -> None:
        removed: dict[TableKey, set[int]] = {}
        stored: list[BlocksStored] = []
        cleared = False
        for event in events:
            if type(event) is BlocksStored:
                stored.append(event)
            elif type(event) is BlocksRemoved:
                removed.setdefault(event.table, set()).update(event.hashes)
            else:
                cleared = True
        if self._open:
            pairs = [(event.table, event.hashes) for event in stored]
            self._rejoined_or_removed(view, removed, pairs, cleared, ts)
        opened = self._open
        tables = view.tables
        children = self._children
        for event in stored:
            key, hashes = event.table, event.hashes
            under = children.get(key)
            if under is None:
                under = children[key] = {}
            _python_add_chain(under, event.parent, hashes)
            self.children += len(hashes)
            named = event.parent
            if not hashes or named is None:
                continue
            table = tables.get(key)
            head = hashes[0]
            if table is None or head not in table or named in table or (key, head) in opened:
                continue
            if named in removed.get(key, ()):
                continue
            self.found.append(self._entry(table, head, named, ts))
        for key, gone in removed.items():
            table = tables.get(key)
            under = children.get(key)
            if table is None or under is None:
                continue
            for parent in sorted(gone):
                if parent in table:
                    continue
                kids = under.pop(parent, None)
                if kids is None:
                    continue
                for h in (kids,) if isinstance(kids, int) else sorted(kids):
                    if h not in table or table.parent_of(h) != parent or (key, h) in opened:
                        continue
                    if (key, h) not in self._seen_evicted:
                        self._seen_evicted.add((key, h))
                        self.evicted.append(self._entry(table, h, parent, ts))


def _root(key: TableKey, h: int) -> int | None:
    return h % 3 or None


_hashes = st.integers(0, 30)
_event = st.one_of(
    st.builds(
        lambda hashes, parent, key: BlocksStored(hashes, parent, [], 1, key),
        st.lists(_hashes, min_size=1, max_size=5, unique=True),
        st.one_of(st.none(), _hashes),
        st.sampled_from(KEYS),
    ),
    st.builds(
        BlocksRemoved,
        st.lists(_hashes, min_size=1, max_size=5, unique=True),
        st.sampled_from(KEYS),
    ),
    st.just(AllCleared()),
)
_batches = st.lists(st.lists(_event, max_size=6), max_size=25)
# Hashes as a publisher's 64-bit ones come (high bits set), and chains with a hash repeated.
_wide = st.one_of(_hashes, st.integers(2**64 - 12, 2**64 - 1))
_wide_event = st.one_of(
    st.builds(
        lambda hashes, parent, key: BlocksStored(hashes, parent, [], 1, key),
        st.lists(_wide, min_size=1, max_size=5),
        st.one_of(st.none(), _wide),
        st.sampled_from(KEYS),
    ),
    st.builds(BlocksRemoved, st.lists(_wide, min_size=1, max_size=5), st.sampled_from(KEYS)),
    st.just(AllCleared()),
)
_wide_batches = st.lists(st.lists(_wide_event, max_size=6), max_size=25)


def _weighted(batches: list[list[KVEvent]], clears: int) -> list[list[KVEvent]]:
    """Keeps only every `clears`-th clear, so that most streams run long without one."""
    kept, seen = [], 0
    for events in batches:
        out = []
        for event in events:
            if isinstance(event, AllCleared):
                seen += 1
                if seen % clears:
                    continue
            out.append(event)
        kept.append(out)
    return kept


def _assert_same(
    mine: Orphans,
    reference: Orphans,
    first: list[list[KVEvent]],
    rest: list[list[KVEvent]],
    clears: int,
    every_batch: bool = False,
) -> None:
    """Both followed from the map just after the clear (`first` applied) through `rest`
    (`every_batch`: their records compared after each batch too)."""
    view = PrefixMap(StreamId("r", 0))
    for seq, events in enumerate(_weighted(first, clears)):
        view.apply(Batch(seq, float(seq), 0, events))
    mine.start(view, 100.0)
    reference.start(view, 100.0)
    for seq, events in enumerate(_weighted(rest, clears), start=101):
        view.apply(Batch(seq, float(seq), 0, events))
        mine.after(view, events, float(seq))
        reference.after(view, events, float(seq))
        if every_batch:
            assert mine.result() == reference.result()
            assert mine.evicted_result() == reference.evicted_result()
    assert mine.result() == reference.result()
    assert mine.evicted_result() == reference.evicted_result()
    assert mine.children == reference.children
    assert mine._children == reference._children


@settings(max_examples=300, deadline=None)
@given(_batches, _batches, st.integers(1, 6))
def test_index_finds_what_the_full_scan_found(
    first: list[list[KVEvent]], rest: list[list[KVEvent]], clears: int
) -> None:
    _assert_same(Orphans(_root), FullScanOrphans(_root), first, rest, clears)


@settings(max_examples=300, deadline=None)
@given(_wide_batches, _wide_batches, st.integers(1, 6))
def test_compiled_step_finds_what_python_found(
    first: list[list[KVEvent]], rest: list[list[KVEvent]], clears: int
) -> None:
    _assert_same(Orphans(_root), PythonOrphans(_root), first, rest, clears)


@settings(max_examples=300, deadline=None)
@given(_batches, _batches, st.integers(1, 6))
def test_records_kept_are_those_made_anew(
    first: list[list[KVEvent]], rest: list[list[KVEvent]], clears: int
) -> None:
    _assert_same(Orphans(_root), FreshRecords(_root), first, rest, clears, every_batch=True)
