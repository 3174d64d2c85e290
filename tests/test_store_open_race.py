"""Processes that open one new store at once: each migrates it, and they must not trip over
each other (a collector starting beside `kvscope report`, or a test reading the store the
collector it started is still creating)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier

from sqlalchemy import inspect

from kvscope.storage.engine import open_store, schema_revisions

OPENERS = 6


def _open(url: str, barrier: Barrier) -> None:
    barrier.wait()
    open_store(url).dispose()


def test_processes_opening_a_new_store_at_once_all_succeed(store_url: str) -> None:
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(OPENERS)
    openers = [spawn.Process(target=_open, args=(store_url, barrier)) for _ in range(OPENERS)]
    for process in openers:
        process.start()
    for process in openers:
        process.join(120)
    assert [p.exitcode for p in openers] == [0] * OPENERS
    engine = open_store(store_url)
    current, head = schema_revisions(engine)
    assert current == head
    assert "streams" in inspect(engine).get_table_names()
    engine.dispose()
