"""The store queue's overflow goes to a local file, in order, and comes back out in order; only
past the file's cap is a row refused."""

from __future__ import annotations

import threading
from pathlib import Path

from kvscope.config import StoreConfig
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.spill import Spill
from kvscope.store_commands import open_writer


def test_the_spill_keeps_rows_in_order_up_to_its_cap(tmp_path: Path) -> None:
    spill: Spill[tuple[int, bytes]] = Spill(max_bytes=10_000, directory=str(tmp_path))
    kept = [(i, bytes(50)) for i in range(1000) if spill.put((i, bytes(50)))]
    assert 50 < len(kept) < 1000 and len(spill) == len(kept)
    assert spill.take(10) == kept[:10]
    assert spill.take(10_000) == kept[10:]
    assert not spill.active and spill.bytes_held == 0
    assert spill.put((5, b"again")) and spill.take(1) == [(5, b"again")]


def test_the_queue_spills_its_overflow_and_hands_everything_over_in_order(
    tmp_path: Path,
) -> None:
    queue: RowQueue[tuple[str, int]] = RowQueue(
        10, linger_s=0.0, spill=Spill(1 << 20, str(tmp_path))
    )
    for i in range(500):
        assert queue.put(("batch", i), True)
        if i % 100 == 0:
            queue.put(("reset", i), False)  # rare rows are never dropped, never spilled
    assert queue.pending == 505
    taken: list[tuple[str, int]] = []
    while len(taken) < 505:
        rows = queue.take(64)
        assert rows is not None
        taken.extend(rows)
        queue.done(sum(1 for kind, _ in rows if kind == "batch"))
    assert [i for kind, i in taken if kind == "batch"] == list(range(500))
    assert [i for kind, i in taken if kind == "reset"] == [0, 100, 200, 300, 400]
    assert queue.pending == 0 and queue.written_total == queue.put_total == 505
    # Drained: room in memory again, and the next rows go there.
    assert queue.put(("batch", 500), True) and not queue.spill_active


def test_a_full_spill_refuses_and_a_consumer_drains_it_meanwhile(tmp_path: Path) -> None:
    queue: RowQueue[int] = RowQueue(5, linger_s=0.0, spill=Spill(200, str(tmp_path)))
    accepted = [i for i in range(100) if queue.put(i, True)]
    assert 5 < len(accepted) < 100
    got: list[int] = []

    def consume() -> None:
        while (rows := queue.take(7)) is not None:
            got.extend(rows)
            queue.done(len(rows))

    consumer = threading.Thread(target=consume)
    consumer.start()
    more = [i for i in range(100, 20_000) if queue.put(i, True)]
    queue.close()
    consumer.join(30)
    assert got == accepted + more  # in order, whatever was refused meanwhile


def test_collect_and_serve_pass_the_spill_settings_to_the_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    off = open_writer(StoreConfig(url, spill_bytes=0))
    assert off is not None and off.settings.spill_bytes == 0 and off.spill_bytes == 0
    off.close()
    on = open_writer(StoreConfig(url, spill_bytes=4096, spill_dir=str(tmp_path)))
    assert on is not None and (on.settings.spill_bytes, on.settings.spill_dir) == (
        4096,
        str(tmp_path),
    )
    on.close()
