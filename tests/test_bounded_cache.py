"""storage/bounded_cache.py: the readers' most-recently-used caches."""

from __future__ import annotations

import threading

import pytest

from kvscope.storage.bounded_cache import BoundedCache


def test_past_its_bound_the_least_recently_used_goes_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(3)
    for i, key in enumerate("abc"):
        assert cache.put(key, i) == i
    assert cache.get("a") == 0  # a hit: "a" is now the most recently used
    cache.put("d", 3)
    assert cache.keys() == ["c", "a", "d"]  # "b", the least recently used, went
    assert cache.get("b") is None
    cache.put("c", 20)  # put again: replaced in its place, still the least recently used
    cache.put("e", 4)
    assert cache.keys() == ["a", "d", "e"]
    assert cache.get("c") is None


def test_a_miss_leaves_the_order_as_it_was_and_clear_empties_it() -> None:
    cache: BoundedCache[int, str] = BoundedCache(2)
    cache.put(1, "one")
    cache.put(2, "two")
    assert cache.get(3) is None
    assert cache.keys() == [1, 2]
    cache.clear()
    assert cache.keys() == [] and cache.get(1) is None


def test_a_cache_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BoundedCache[int, int](0)


def test_threads_putting_and_getting_at_once_never_pass_the_bound() -> None:
    cache: BoundedCache[int, int] = BoundedCache(4)
    sizes: list[int] = []

    def churn(offset: int) -> None:
        for i in range(2000):
            cache.put(offset + i % 7, i)
            cache.get(offset + (i + 3) % 7)
            sizes.append(len(cache.keys()))

    threads = [threading.Thread(target=churn, args=(n * 100,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(sizes) <= 4 and len(cache.keys()) == 4
