"""storage/row_heads.py: each row's first bytes, as substr would give them, without reading a
SQLite blob whole."""

from __future__ import annotations

import random
from pathlib import Path

import sqlalchemy as sa

from kvscope.storage.engine import make_engine
from kvscope.storage.row_heads import fill_from_heads, row_heads

_META = sa.MetaData()
_ITEMS = sa.Table(
    "items",
    _META,
    sa.Column("a", sa.Integer, primary_key=True),
    sa.Column("b", sa.Integer, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("named", sa.LargeBinary),
)
MAGIC = b"KV\x00\x07"


def _blobs(rng: random.Random) -> list[bytes]:
    """Empty, shorter than a head, across pages, and some starting with MAGIC."""
    sizes = [0, 1, 3, 4, 9, 600, 5000, 70_000] + [rng.randrange(0, 20_000) for _ in range(20)]
    return [rng.randbytes(n) for n in sizes] + [MAGIC + rng.randbytes(300), MAGIC, MAGIC[:2]]


def _stored(url: str, blobs: list[bytes]) -> sa.Engine:
    engine = make_engine(url)
    _META.create_all(engine)
    with engine.begin() as conn:
        # Keys not in insertion order: the heads come in key order.
        rows = [{"a": (i * 7) % 5, "b": -i, "data": d} for i, d in enumerate(blobs)]
        conn.execute(sa.insert(_ITEMS), rows)
    return engine


def _expected(
    blobs: list[bytes], n: int, starting: bytes = b""
) -> list[tuple[tuple[int, int], bytes]]:
    rows = [((i * 7) % 5, -i) for i in range(len(blobs))]
    return sorted((k, d[:n]) for k, d in zip(rows, blobs, strict=True) if d.startswith(starting))


def test_the_heads_are_each_rows_first_bytes_in_key_order(store_url: str) -> None:
    blobs = _blobs(random.Random(3))
    engine = _stored(store_url, blobs)
    with engine.connect() as conn:
        for n in (1, 4, 10, 5000):
            assert list(row_heads(conn, _ITEMS, "data", n)) == _expected(blobs, n)
        assert list(row_heads(conn, _ITEMS, "data", 8, MAGIC)) == _expected(blobs, 8, MAGIC)
    engine.dispose()


def test_a_column_is_filled_from_what_the_heads_name(store_url: str) -> None:
    blobs = _blobs(random.Random(4))
    engine = _stored(store_url, blobs)
    with engine.begin() as conn:
        fill_from_heads(conn, "items", "data", 6, "named", lambda h: h[4:] or None, MAGIC)
        found = conn.execute(sa.select(_ITEMS.c.data, _ITEMS.c.named)).all()
    assert sorted(bytes(n) for _, n in found if n is not None) == sorted(
        d[4:6] for d in blobs if d.startswith(MAGIC) and len(d) > 4
    )
    assert all(n is None or bytes(d).startswith(MAGIC) for d, n in found)
    engine.dispose()


def _read_chars() -> int:
    """Bytes this process has read through read(2) and pread(2): SQLite's page reads."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_sqlite_reads_the_pages_of_a_head_not_the_whole_blob(tmp_path: Path) -> None:
    """substr reads a blob whole on SQLite (every overflow page): 16 MiB for these rows."""
    url = f"sqlite:///{tmp_path / 'heads.sqlite'}"
    rng = random.Random(5)
    blobs = [MAGIC + rng.randbytes(1 << 20) for _ in range(16)]
    _stored(url, blobs).dispose()
    engine = make_engine(url)  # a new connection: nothing of the file in its page cache
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA mmap_size=0")  # pages come through read(2)
        before = _read_chars()
        heads = list(row_heads(conn, _ITEMS, "data", 64, MAGIC))
        read = _read_chars() - before
    assert heads == _expected(blobs, 64)
    assert read < 1 << 20, f"read {read} bytes for {len(heads)} heads"
    engine.dispose()
