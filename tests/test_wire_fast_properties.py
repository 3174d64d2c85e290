"""The compiled map-layout decoder against the slow path (msgspec's decoders and the rules of
collector/wire_rules.py): whenever it returns a Batch, the slow path must accept the payload and
return the same Batch. What the slow path refuses, the fast one must therefore decline."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.collector._wire_fast import decode_map_batch
from tests.wire_fast_strategies import SETTINGS, batch, encoded
from tests.wire_fast_support import MAX_BS, check


@SETTINGS
@given(st.data())
def test_every_vllm_shaped_batch_decodes_fast_to_the_slow_paths_batch(data: st.DataObject) -> None:
    payload = encoded(data, data.draw(batch()))
    assert check(payload) is not None


@SETTINGS
@given(st.data())
def test_any_batch_decodes_fast_to_the_slow_paths_batch_or_falls_back(data: st.DataObject) -> None:
    check(encoded(data, data.draw(batch(wild=True))))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_truncation_falls_back(data: st.DataObject) -> None:
    payload = encoded(data, data.draw(batch()))
    for end in range(len(payload)):
        assert decode_map_batch(payload[:end], 0, MAX_BS) is None


@SETTINGS
@given(st.data())
def test_corrupted_bytes_never_crash_nor_mislead(data: st.DataObject) -> None:
    payload = bytearray(encoded(data, data.draw(batch())))
    for _ in range(data.draw(st.integers(1, 3))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    check(bytes(payload))
