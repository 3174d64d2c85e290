"""The writer thread's log work lets go of the GIL where it walks bytes: the ingest thread, on
another core, runs meanwhile rather than waiting its turn. Shown by progress, not time: with a
switch interval too long to ever force a hand-over, a second thread runs while the call is in
progress only if the call lets the GIL go itself."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable

from kvscope.storage.log_dictionary import GRANULE, StreamContent
from tests.test_log_dictionary import payload, stored


def runs_beside(call: Callable[[], object]) -> int:
    """How many times a second thread ran while `call` was in progress."""
    state = {"inside": False, "done": False, "hits": 0}

    def other() -> None:
        while not state["done"]:
            if state["inside"]:
                state["hits"] += 1
            time.sleep(0.0002)  # lets the GIL go: the caller is never kept waiting for it

    was = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=other)
    try:
        thread.start()
        state["inside"] = True
        call()
        state["inside"] = False
    finally:
        state["done"] = True
        sys.setswitchinterval(was)
        thread.join()
    return state["hits"]


def test_noting_a_transaction_s_content_lets_another_thread_run() -> None:
    rng = random.Random(4)
    blocks = [[rng.randrange(1 << 20) for _ in range(GRANULE)] for _ in range(4000)]
    payloads = [
        payload([stored([t for b in rng.sample(blocks, 40) for t in b], [1])]) for _ in range(3000)
    ]
    content = StreamContent(cap=1 << 30)
    assert runs_beside(lambda: content.see(payloads)) > 0
    assert len(content.runs()) == len(blocks)
