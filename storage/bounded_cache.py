"""A small thread-safe cache of the most recently used entries, for what readers decode once
and read many times (dictionaries, known blocks): at most `bound` entries, the least recently
used going first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError(f"a cache holds at least one entry, not {bound}")
        self.bound = bound
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The entry under `key`, made the most recently used; None if not kept."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> V:
        """Keep `value` (a new key as the most recently used, a kept one in its place), the
        least recently used going past the bound; returns it."""
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.bound:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def keys(self) -> list[K]:
        """The keys kept, least recently used first."""
        with self._lock:
            return list(self._entries)
