"""The fleet's rank scan against msgspec's decoders: whenever the scan names a rank, it is the
one msgspec reads (collector/fleet.py's `decoded_rank`); what it cannot tell, it declines."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kvscope.collector import wire_rules
from kvscope.collector._batch_rank import scan_rank
from kvscope.collector._wire_fast import decode_map_batch
from kvscope.collector.fleet import MAX_RANK, batch_rank, decoded_rank
from tests.wire_fast_strategies import SETTINGS, batch, encoded
from tests.wire_fast_support import MAX_BS


def agrees(payload: bytes) -> int:
    scanned = scan_rank(payload, MAX_RANK)
    assert scanned == -1 or scanned == decoded_rank(payload)
    assert batch_rank(payload) == decoded_rank(payload)
    # The router takes the rank of a batch the compiled decoder accepts from that batch.
    fast = decode_map_batch(payload, 0, MAX_BS)
    if fast is not None:
        assert batch_rank(payload, fast) == decoded_rank(payload)
    return scanned


@SETTINGS
@given(st.data())
def test_every_vllm_shaped_batch_is_scanned_to_msgspecs_rank(data: st.DataObject) -> None:
    assert agrees(encoded(data, data.draw(batch()))) >= 0


@SETTINGS
@given(st.data())
def test_any_batch_is_scanned_to_msgspecs_rank_or_declined(data: st.DataObject) -> None:
    agrees(encoded(data, data.draw(batch(wild=True))))


@SETTINGS
@given(st.data())
def test_corrupted_or_cut_batches_are_never_misread(data: st.DataObject) -> None:
    payload = bytearray(encoded(data, data.draw(batch())))
    agrees(bytes(payload[: data.draw(st.integers(0, len(payload)))]))
    for _ in range(data.draw(st.integers(1, 3))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    agrees(bytes(payload))


def test_every_rank_the_decoder_accepts_is_a_dp_rank() -> None:
    assert wire_rules.MAX_RANK < MAX_RANK  # so the decoded rank needs no bound of its own


def test_the_edges_of_the_shape() -> None:
    enc = msgspec.msgpack.encode
    assert agrees(enc([1.0, [], 7])) == 7
    assert agrees(enc([1.0, [], None])) == 0
    assert agrees(enc([1.0, []])) == 0
    assert agrees(enc([1.0, [], MAX_RANK])) == 0  # not a DP rank
    assert agrees(enc([1.0, [], -1])) == 0
    for declined in (
        enc([1.0, [], 2**64 - 1]),  # past int64: msgspec's to read
        enc([1.0, [], 1.0]),
        enc([1.0, [], True]),
        enc([1.0, [], 3, 4]),
        enc([1.0]),
        enc({"data_parallel_rank": 2}),
        enc([1.0, [], 2]) + b"\x00",
        b"",
    ):
        assert agrees(declined) == -1
