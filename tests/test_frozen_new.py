"""storage/_frozen_new.pyx makes a reset answer's `PrefixGroup` as its `__init__` does: equal,
the same fields, still frozen."""

from __future__ import annotations

import dataclasses

import pytest

from kvscope.collector.types import TableKey
from kvscope.storage._frozen_new import frozen_new
from kvscope.storage.reset_prefix_types import GroupPoint, PrefixGroup

NAMES = tuple(f.name for f in dataclasses.fields(PrefixGroup))


def test_made_as_init_makes_it() -> None:
    values = (
        TableKey("GPU", 0),
        7,
        b"\x07",
        True,
        (1, 2),
        3,
        48,
        1,
        (GroupPoint(1.0, 2, 1, 0),),
        1.0,
        "back at +1 s",
        2,
    )
    made = frozen_new(PrefixGroup, NAMES, values)
    assert type(made) is PrefixGroup
    assert made == PrefixGroup(*values)
    assert dataclasses.astuple(made) == dataclasses.astuple(PrefixGroup(*values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.blocks = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        frozen_new(PrefixGroup, NAMES, values[:-1])


def test_a_group_has_no_post_init_to_skip() -> None:
    """`frozen_new` does not call `__post_init__`: a `PrefixGroup` that gained one would be made
    without it, silently."""
    assert not hasattr(PrefixGroup, "__post_init__")
