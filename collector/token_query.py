"""A lookup's tokens, packed once per block size and token width for every table it is run
against (`BlockTable.longest_prefix`, collector/_lookup.pyx)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from kvscope.collector._token_column import pack_query


class TokenQuery:
    """A lookup's tokens, shared by every table it is run against (`longest_prefix` reads them in
    place, a block at a time)."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self.tokens = (
            token_ids
            if isinstance(token_ids, array) and token_ids.typecode == "I"
            else array("I", token_ids)
        )
        self._first: dict[int, bytes] = {}
        self._packed: dict[tuple[int, int], tuple[bytes, int]] = {}

    def first_block(self, block_size: int) -> bytes:
        """The first block's tokens as `_roots` keys them (computed once per block size)."""
        first = self._first.get(block_size)
        if first is None:
            first = self._first[block_size] = self.tokens[:block_size].tobytes()
        return first

    def packed(self, block_size: int, width: int) -> tuple[bytes, int]:
        """The leading blocks packed as a tokens column of `width` bits holds them, and how
        many (those before the first with a wider token), computed once per size and width."""
        key = (block_size, width)
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = pack_query(self.tokens, block_size, width)
        return packed
