"""Leases: several collectors on one PostgreSQL, exactly one writer per stream.

A collector is a *member* while its heartbeat row has not expired (`lease_members.expires_at`,
on the database's clock, so the collectors' clocks never matter). A stream's lease
(`stream_leases`) names its owner and a fencing token that grows by one at every grant; it is
valid while its owner is a live member. A lease whose owner stopped beating (`kill -9`, a host
gone) may be taken by another member, with the next token. Every write transaction of the
store's writer checks, inside itself, that the lease still names this member and its token
(`Fence.admit`; a write that is one statement, within that statement: `LeaseCheck`), holding
the row so a taker waits for the write to commit: a stale writer's rows are refused and
nothing of them lands. `lease_grants` keeps every grant and when its
writes landed. PostgreSQL only (`clock_timestamp()`, row locks).

Which member should hold a stream is rendezvous hashing over the live members (`owner_of`):
each computes the same answer, and a member joining or leaving moves only its share.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import Connection, and_, exists, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.pg_arrays import INT4, INT8, TEXT, columns

M, L, G = schema.lease_members, schema.stream_leases, schema.lease_grants


class LeaseError(ValueError):
    """Leases asked for where they cannot work (a store that is not PostgreSQL)."""


@dataclass(frozen=True)
class LeaseSettings:
    ttl_s: float = 10.0
    """A member (and every lease it holds) is taken for dead this long after its last
    heartbeat: its streams are taken over after this, plus at most one `renew_s`."""
    renew_s: float = 2.0
    """Heartbeat, and look at the members and the leases, this often: shorter than `ttl_s`
    (`collect --lease-renew`, `--lease-ttl`: kvscope/config.py checks it)."""


def check_backend(dialect: str) -> None:
    if dialect != "postgresql":
        raise LeaseError(
            f"leases need PostgreSQL (the store is {dialect}): several collectors share one "
            "PostgreSQL; a SQLite store has one collector, which needs none"
        )


def _now() -> Any:
    return func.clock_timestamp()


def _in(seconds: float) -> Any:
    return _now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def _live(owner: Any) -> Any:
    return exists().where(M.c.id == owner, M.c.expires_at > _now())


def _pk(stream: StreamId) -> Any:
    return and_(L.c.replica == stream.replica, L.c.rank == stream.rank)


def heartbeat(conn: Connection, member: str, ttl_s: float) -> None:
    """The member is alive for `ttl_s` more (it joins on its first beat)."""
    statement = pg_insert(M).values(id=member, started_at=_now(), expires_at=_in(ttl_s))
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[M.c.id], set_={"expires_at": statement.excluded.expires_at}
        )
    )


def forget_dead(conn: Connection, after_s: float = 3600.0) -> int:
    """Members dead (not beating) this long go (a killed one never leaves): how many. Their
    leases stay, free to take (an owner that is no member is not live)."""
    return conn.execute(M.delete().where(M.c.expires_at < _in(-after_s))).rowcount


def live_members(conn: Connection) -> list[str]:
    return sorted(conn.execute(select(M.c.id).where(M.c.expires_at > _now())).scalars())


def owned(conn: Connection, member: str) -> dict[StreamId, int]:
    """The streams whose lease names `member`, with their tokens."""
    rows = conn.execute(select(L.c.replica, L.c.rank, L.c.token).where(L.c.owner == member))
    return {StreamId(r.replica, r.rank): int(r.token) for r in rows}


@dataclass(frozen=True)
class Lease:
    owner: str | None
    token: int
    live: bool
    """The owner is a live member (the lease holds)."""


def leases(conn: Connection) -> dict[StreamId, Lease]:
    """Every stream's lease as it stands."""
    rows = conn.execute(select(L.c.replica, L.c.rank, L.c.owner, L.c.token, _live(L.c.owner)))
    return {StreamId(r[0], r[1]): Lease(r[2], int(r[3]), bool(r[4])) for r in rows}


@dataclass(frozen=True)
class Grant:
    token: int
    takeover: bool
    """Taken from a member whose heartbeat had stopped."""


def acquire(conn: Connection, stream: StreamId, member: str) -> Grant | None:
    """Grant `stream` to `member` with the next token, unless a live member holds it; None if
    one does. Call within a transaction of its own (the row stays locked until it ends)."""
    row = conn.execute(select(L.c.owner, L.c.token).where(_pk(stream)).with_for_update()).first()
    takeover = False
    if row is None:
        token = conn.execute(
            pg_insert(L)
            .values(replica=stream.replica, rank=stream.rank, owner=member, token=1)
            .on_conflict_do_nothing()
            .returning(L.c.token)
        ).scalar_one_or_none()
        if token is None:  # another member made it meanwhile
            return None
    else:
        if row.owner is not None and row.owner != member:
            if conn.execute(select(_live(row.owner))).scalar():
                return None
            takeover = True
        token = conn.execute(
            update(L)
            .where(_pk(stream))
            .values(owner=member, token=L.c.token + 1)
            .returning(L.c.token)
        ).scalar_one()
    conn.execute(
        insert(G).values(
            replica=stream.replica,
            rank=stream.rank,
            token=token,
            owner=member,
            takeover=takeover,
            granted_at=_now(),
            writes=0,
        )
    )
    return Grant(int(token), takeover)


def release(conn: Connection, stream: StreamId, member: str, token: int) -> bool:
    """Give the lease up (its writes are done): free for the next member at once."""
    done = conn.execute(
        update(L).where(_pk(stream), L.c.owner == member, L.c.token == token).values(owner=None)
    ).rowcount
    _grant_released(conn, stream, token)
    return bool(done)


def _grant_released(conn: Connection, stream: StreamId, token: int) -> None:
    conn.execute(
        update(G)
        .where(G.c.replica == stream.replica, G.c.rank == stream.rank, G.c.token == token)
        .where(G.c.released_at.is_(None))
        .values(released_at=_now())
    )


def leave(conn: Connection, member: str) -> None:
    """A member that stops: its remaining leases free, itself gone."""
    for stream, token in owned(conn, member).items():
        release(conn, stream, member, token)
    conn.execute(M.delete().where(M.c.id == member))


def _rank(member: str, stream: StreamId) -> bytes:
    key = f"{member}\0{stream.replica}\0{stream.rank}".encode()
    return hashlib.blake2b(key, digest_size=8).digest()


def owner_of(stream: StreamId, members: Iterable[str]) -> str | None:
    """The member that should hold `stream` (rendezvous hashing); None without members."""
    return max(members, key=lambda m: _rank(m, stream), default=None)


@dataclass
class LeaseStats:
    """Counted by the lease keeper (storage/lease_keeper.py), read by /metrics."""

    acquired: int = 0
    takeovers: int = 0
    """Leases taken from a member whose heartbeat had stopped."""
    released: int = 0
    lost: int = 0
    """Leases found taken by another member (this one had not beaten in time)."""


_KEY_KINDS = bytes((TEXT, INT4, INT8))
"""The arrays a lease check sends its streams' keys in: replicas, ranks, tokens."""
HELD = "SELECT replica, rank FROM held"
"""What a statement that checks leases answers: the streams it found held (`LeaseCheck`)."""


@dataclass(frozen=True)
class LeaseCheck:
    """A write's lease check, as WITH clauses (`SQL`) of the statement it rides in (PostgreSQL;
    psycopg's placeholders, `params` theirs): `held`, the streams whose lease still names this
    member with the token it holds, each lease row locked (FOR SHARE) until the statement's
    transaction ends, so that a taker waits for the write to land; their grants' write times
    set. The statement answers `HELD`, read by `admitted`; what it writes for streams not in
    `held` it must leave out."""

    params: tuple[Any, ...]

    SQL: ClassVar[str] = (
        "held AS (SELECT replica, rank, token FROM stream_leases"
        " WHERE owner = %s AND (replica, rank, token) IN"
        " (SELECT * FROM unnest(%b::text[], %b::int4[], %b::int8[]))"
        " ORDER BY replica, rank FOR SHARE),"
        " granted AS (UPDATE lease_grants AS g"
        " SET first_write_at = coalesce(g.first_write_at, clock_timestamp()),"
        " last_write_at = clock_timestamp(), writes = g.writes + 1"
        " FROM held AS h"
        " WHERE g.replica = h.replica AND g.rank = h.rank AND g.token = h.token)"
    )

    @staticmethod
    def admitted(rows: Iterable[Any]) -> set[StreamId]:
        """The streams of the statement's answer (`HELD`)."""
        return {StreamId(replica, rank) for replica, rank in rows}


class Fence:
    """What the store's writer checks at every write: the streams this member holds, with
    their tokens (set by the lease keeper, read by the writer thread)."""

    def __init__(self, member: str, refused: Callable[[StreamId], None] | None = None) -> None:
        self.member = member
        self.stats = LeaseStats()
        self._tokens: dict[StreamId, int] = {}
        self._lock = threading.Lock()
        self.on_refused = refused
        """Told each stream whose rows were refused (on the writer's thread)."""
        self.refused_rows = 0
        """Rows left out because this member did not hold their stream's lease."""
        self.draining: set[StreamId] = set()
        """Streams let go whose queued rows the writer has not drained yet: not to be taken
        again until it has (their old rows would pass the new token's check)."""

    def hold(self, stream: StreamId, token: int) -> None:
        with self._lock:
            self._tokens[stream] = token

    def drop(self, stream: StreamId) -> None:
        with self._lock:
            self._tokens.pop(stream, None)

    def held(self) -> dict[StreamId, int]:
        with self._lock:
            return dict(self._tokens)

    def check(self, streams: set[StreamId]) -> LeaseCheck | None:
        """The lease check of a write of `streams` (`LeaseCheck`); None where this member
        holds none of them: none may be written."""
        tokens = self.held()
        keys = [(s.replica, s.rank, tokens[s]) for s in streams if s in tokens]
        if not keys:
            return None
        return LeaseCheck((self.member, *columns(keys, _KEY_KINDS)))

    def admit(self, conn: Connection, streams: set[StreamId]) -> set[StreamId]:
        """Of `streams`, those whose lease still names this member with its token, locked
        (FOR SHARE) until the transaction ends, and their grants' write times set: one
        statement, ahead of the transaction's writes."""
        check = self.check(streams)
        if check is None:
            return set()
        return check.admitted(conn.exec_driver_sql(f"WITH {LeaseCheck.SQL} {HELD}", check.params))

    def refused(self, stream: StreamId, rows: int) -> None:
        self.refused_rows += rows
        if self.on_refused is not None:
            self.on_refused(stream)
