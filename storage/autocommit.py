"""The writer's connection for one write: a transaction, or, for a write that is one statement,
none (autocommit).

On PostgreSQL a statement sent outside a transaction is a transaction of its own: it lands
whole or not at all. Around one statement, the BEGIN and COMMIT that `Engine.begin` sends are
two round trips more (the writer's thread blocked on the server, which does work for each)
for nothing. The writer says which of its writes are one statement
(storage/sql_writer.py's `RowWriter.one_statement`); every other keeps its transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine


@contextmanager
def writing(engine: Engine, one_statement: bool) -> Iterator[Connection]:
    """A connection in a transaction, committed at the end (rolled back on an error); with
    `one_statement` (PostgreSQL only), in autocommit: the one statement commits itself."""
    if not one_statement:
        with engine.begin() as conn:
            yield conn
        return
    # Set for this checkout alone: the pool puts the connection back as it was.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn
        conn.commit()  # SQLAlchemy's own: the driver sends nothing
