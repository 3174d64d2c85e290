"""A small model of SGLang's RadixCache with KV events on, publishing as SGLang does.

After SGLang 0.5.23's source (python/sglang/srt/mem_cache/radix_cache.py and
disaggregation/kv_events.py; its package does not import here without its GPU stack): the
cache holds pages of `page` tokens in a tree; inserting a prompt stores each page not cached
yet as its own `BlockStored` (hash: the first 16 hex digits of sha256 over the parent's hash
and the page's tokens, as a signed int64; parent: the page before, None under the root);
eviction takes least-recently-used leaves and says `BlockRemoved` with their hashes; a reset
says `AllBlocksCleared`. The events of a scheduler step go out as one `EventBatch`.

`pages` is the model's own map, hash for hash, against which a collector's map is checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.sglang_events import Event, sglang_cleared, sglang_removed, sglang_stored


def page_hash(parent: int | None, tokens: Sequence[int]) -> int:
    digest = hashlib.sha256()
    if parent is not None:
        digest.update(parent.to_bytes(8, "big", signed=True))
    for token in tokens:
        digest.update(token.to_bytes(4, "little"))
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


@dataclass
class Page:
    parent: int | None
    tokens: tuple[int, ...]
    children: set[int] = field(default_factory=set)
    last_access: int = 0


class RadixModel:
    def __init__(self, page: int, capacity: int) -> None:
        self.page = page
        self.capacity = capacity
        """Pages the cache holds at most: inserting past it evicts first."""
        self.pages: dict[int, Page] = {}
        self._events: list[Event] = []
        self._clock = 0

    def insert(self, tokens: Sequence[int]) -> None:
        """A request's prompt cached: its full pages, each stored once."""
        parent: int | None = None
        path: set[int] = set()
        for start in range(0, len(tokens) - self.page + 1, self.page):
            chunk = tuple(tokens[start : start + self.page])
            h = page_hash(parent, chunk)
            self._clock += 1
            if h not in self.pages:
                self.evict(len(self.pages) + 1 - self.capacity, keep=path)
                self.pages[h] = Page(parent, chunk)
                if parent is not None:
                    self.pages[parent].children.add(h)
                self._events.append(sglang_stored(h, parent, chunk))
            self.pages[h].last_access = self._clock
            path.add(h)
            parent = h

    def evict(self, n: int, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """Up to `n` least-recently-used leaves (and the leaves they leave), one event."""
        gone: list[int] = []
        while len(gone) < n:
            leaves = [h for h, p in self.pages.items() if not p.children and h not in keep]
            if not leaves:
                break
            h = min(leaves, key=lambda k: self.pages[k].last_access)
            page = self.pages.pop(h)
            if page.parent is not None:
                self.pages[page.parent].children.discard(h)
            gone.append(h)
        if gone:
            self._events.append(sglang_removed(gone))

    def reset(self) -> None:
        self.pages.clear()
        self._events.append(sglang_cleared())

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events
