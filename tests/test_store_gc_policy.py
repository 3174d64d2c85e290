"""The store's GC policy (storage/gc_policy.py): a higher young-generation threshold while a
writer runs, and cyclic garbage still collected under it, without a `gc.collect()` call."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.storage.engine import open_store
from kvscope.storage.gc_policy import raise_young_threshold
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter


@pytest.fixture(autouse=True)
def kept_threshold() -> Iterator[None]:
    """The thresholds are the process's: each test leaves them as it found them."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_writer_raises_the_young_threshold_only(tmp_path: Path) -> None:
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    writer.close()
    assert gc.get_threshold() == (StoreSettings.gc_young_threshold, 10, 10)


def test_none_leaves_the_threshold(tmp_path: Path) -> None:
    writer = StoreWriter(
        open_store(f"sqlite:///{tmp_path / 's.sqlite'}"), StoreSettings(gc_young_threshold=None)
    )
    writer.close()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_is_never_lowered() -> None:
    gc.set_threshold(50_000, 20, 30)
    raise_young_threshold(10_000)
    assert gc.get_threshold() == (50_000, 20, 30)
    raise_young_threshold(0)  # 0 disables collection: never set
    assert gc.get_threshold() == (50_000, 20, 30)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_cyclic_garbage_is_still_collected_under_the_policy() -> None:
    """Cycles made and dropped, many times the threshold of them: the collector runs by itself
    and frees them, so the live ones stay within a few thresholds' worth (memory is bounded)."""
    assert gc.isenabled()
    raise_young_threshold(StoreSettings.gc_young_threshold)
    threshold = gc.get_threshold()[0]
    alive: weakref.WeakSet[Node] = weakref.WeakSet()
    peak = 0
    for _ in range(50 * threshold):
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: refcounting alone never frees it
        alive.add(a)
        peak = max(peak, len(alive))
    del a, b
    assert peak < 4 * threshold
    assert len(alive) < 4 * threshold
