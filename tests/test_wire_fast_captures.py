"""The compiled decoder on what vLLM 0.33 really sent: every captured payload decodes as today."""

from __future__ import annotations

import random

import pytest

from kvscope.collector.capture import read_capture
from tests.conftest import capture_path
from tests.wire_fast_support import check


# --- what vLLM 0.33 really sent ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lab_3rps_180s", "lab_10rps_300s"])
def test_every_captured_payload_decodes_fast_to_todays_batch(name: str) -> None:
    rnd = random.Random(name)
    for i, record in enumerate(read_capture(capture_path(f"{name}.msgpack.gz"))):
        assert check(record.payload, record.seq) is not None
        if i % 20 == 0:  # and a few corrupted copies of it
            for _ in range(10):
                bad = bytearray(record.payload)
                bad[rnd.randrange(len(bad))] = rnd.randrange(256)
                check(bytes(bad))
