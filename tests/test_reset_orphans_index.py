"""storage/reset_orphans.py looks, at each batch, only at the open orphans the batch's events
name: it finds what a scan of every open orphan at every batch (as it did before) finds, on
random streams of stores, removals and clears."""

from __future__ import annotations

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

KEYS = (TableKey("GPU", 0), TableKey("CPU", 0))


class FullScanOrphans(Orphans):
    """Every open entry checked at every batch, as before the index."""

    def _rejoined_or_removed(
        self,
        view: PrefixMap,
        removed: dict[TableKey, set[int]],
        stored: list[BlocksStored],
        cleared: bool,
        ts: float,
    ) -> None:
        for entry in list(self._open.values()):
            self._settle(view, entry, ts)


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
) -> None:
    """Both followed from the map just after the clear (`first` applied) through `rest`."""
    view = PrefixMap(StreamId("r", 0))
    for seq, events in enumerate(_weighted(first, clears)):
        view.apply(Batch(seq, float(seq), 0, events))
    mine.start(view, 100.0)
    reference.start(view, 100.0)
    for seq, events in enumerate(_weighted(rest, clears), start=101):
        view.apply(Batch(seq, float(seq), 0, events))
        mine.after(view, events, float(seq))
        reference.after(view, events, float(seq))
    assert mine.result() == reference.result()
    assert mine.evicted_result() == reference.evicted_result()


@settings(max_examples=300, deadline=None)
@given(_batches, _batches, st.integers(1, 6))
def test_index_finds_what_the_full_scan_found(
    first: list[list[KVEvent]], rest: list[list[KVEvent]], clears: int
) -> None:
    _assert_same(Orphans(_root), FullScanOrphans(_root), first, rest, clears)
