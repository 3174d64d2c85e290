"""What the store's writer costs PostgreSQL: round trips and the server's CPU per block-event.

    python benchmarks/pg_statements.py [--events N] [--cached C] [--seed S] [--rounds R]
                                       [--baseline-tree PATH]

benchmarks/store.py's stream (benchmarks/ingest.py's model of vLLM's BlockPool) is ingested with
a PostgreSQL store on (a database of its own, dropped after), until the writer has committed
the last row. Each run prints, per 1M block-events:
- round trips: the statements the writer sent, plus the BEGIN and COMMIT its driver sent around
  them (psycopg sends BEGIN before a transaction's first statement, COMMIT at its end; neither
  in autocommit);
- the server's CPU: user and system time of the writer's server processes (backends) over the
  run, from /proc (the server on this machine; pg_stat_statements needs a server restarted
  with it preloaded);
- the writer thread's wall seconds within those round trips, and the part of them it was
  blocked (not on a core, nor waiting for one: the server, the network, the GIL on the way
  back; benchmarks/_thread_clock.py).

Beside it, a baseline measured in the same run, the runs interleaved: `--baseline-tree PATH`
(another checkout's kvscope, e.g. a worktree of main, made importable), else this tree with
every write in a transaction (`RowWriter.one_statement` always false: the transaction mode
before storage/autocommit.py). Each run is a process of its own. The last line is one JSON
object with the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage.engine import open_store
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ingest_stream import make_stream
from _pg import database_url, fresh_database
from _thread_clock import ThreadClock, thread_clock

STREAM = StreamId("bench", 0)
IDLE = 0
"""psycopg's `pq.TransactionStatus.IDLE`: no transaction open on the connection."""
_TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """A server process's user and system CPU seconds so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


class RoundTrips:
    """Counts what `engine`'s connections send: statements, the driver's BEGINs and COMMITs,
    the wall and blocked seconds of the thread that sent them; and the backends' pids."""

    def __init__(self, engine: Engine) -> None:
        self.statements = 0
        self.begins = 0
        self.commits = 0
        self.wall_s = 0.0
        self.blocked_s = 0.0
        self.backends: set[int] = set()
        self._open: dict[int, tuple[float, ThreadClock | None]] = {}
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        dialect = engine.dialect
        commit = dialect.do_commit

        def do_commit(connection: Any) -> None:
            dbapi = connection.dbapi_connection  # the pool's proxy is given
            sent = not dbapi.autocommit and dbapi.info.transaction_status != IDLE
            self._start()
            commit(connection)
            self._stop()
            self.commits += sent

        dialect.do_commit = do_commit  # type: ignore[method-assign,assignment]

    def _connected(self, dbapi_connection: Any, _record: Any) -> None:
        self.backends.add(int(dbapi_connection.info.backend_pid))

    def _before(self, conn: Any, *_args: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        self.statements += 1
        self.begins += not dbapi.autocommit and dbapi.info.transaction_status == IDLE
        self._start()

    def _after(self, *_args: Any) -> None:
        self._stop()

    def _start(self) -> None:
        tid = threading.get_native_id()
        self._open[tid] = (time.perf_counter(), thread_clock(tid))

    def _stop(self) -> None:
        tid = threading.get_native_id()
        started, clock = self._open.pop(tid)
        wall = time.perf_counter() - started
        self.wall_s += wall
        now = thread_clock(tid)
        if clock is not None and now is not None:
            self.blocked_s += (now - clock).blocked(wall)

    @property
    def round_trips(self) -> int:
        return self.statements + self.begins + self.commits


def measure(events: int, cached: int, seed: int, transactions_only: bool) -> dict[str, Any]:
    """One run into a new database: its counts (see the module's docstring)."""
    if transactions_only:
        from kvscope.storage.sql_writer import RowWriter

        RowWriter.one_statement = lambda *_: False  # type: ignore[method-assign]
    payloads, stats = make_stream(events, seed, cached, 10**12)
    frames = [[b"", seq.to_bytes(8, "big"), p] for seq, p in enumerate(payloads)]
    with fresh_database("kvscope_pgstmt_") as name:
        engine = open_store(database_url(name))
        engine.dispose()  # the migrations' connection and its server process gone
        trips = RoundTrips(engine)
        writer = StoreWriter(engine, StoreSettings(queue_rows=10_000_000))
        ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
        started = time.perf_counter()
        for frame in frames:
            ingest.live_frames(frame, time.time())
        assert writer.flush(600, idle_work=True), "the writer stopped"
        elapsed = time.perf_counter() - started
        # Read before the connections close: their processes end with them.
        server_cpu = sum(backend_cpu_s(pid) for pid in trips.backends)
        transactions = writer.stats.transactions
        writer_cpu = writer.stats.writer_cpu_seconds_total
        writer.close(600)
        assert writer.stats.batches_dropped == 0 and writer.stats.rows_refused == 0
        engine.dispose()
    per_m = 1e6 / stats.block_events
    return {
        "block_events": stats.block_events,
        "batches": len(frames),
        "writer_transactions": transactions,
        "statements": trips.statements,
        "begin_commit": trips.begins + trips.commits,
        "round_trips_per_1m": round(trips.round_trips * per_m),
        "server_cpu_ms_per_1m": round(server_cpu * 1000 * per_m),
        "round_trip_wall_s_per_1m": round(trips.wall_s * per_m, 3),
        "round_trip_blocked_s_per_1m": round(trips.blocked_s * per_m, 3),
        "writer_cpu_s_per_1m": round(writer_cpu * per_m, 3),
        "ingest_block_events_per_s": round(stats.block_events / elapsed),
    }


def _run(args: argparse.Namespace, tree: Path, transactions_only: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", "--events", str(args.events)]
    command += ["--cached", str(args.cached), "--seed", str(args.seed)]
    if transactions_only:
        command.append("--transactions-only")
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="block-events to ingest")
    parser.add_argument("--cached", type=int, default=100_000, help="cached blocks when full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each, interleaved")
    parser.add_argument(
        "--baseline-tree", type=Path, help="the baseline's checkout (default: this tree)"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--transactions-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.events, args.cached, args.seed, args.transactions_only)))
        return
    this_tree = Path(__file__).resolve().parents[1]
    if args.baseline_tree is None:
        kinds = {"baseline": (this_tree, True), "this": (this_tree, False)}
        print(f"baseline: {this_tree}, every write in a transaction")
    else:
        kinds = {"baseline": (args.baseline_tree.resolve(), False), "this": (this_tree, False)}
        print(f"baseline: {args.baseline_tree.resolve()}")
    print(f"this:     {this_tree}")
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, (tree, transactions_only) in kinds.items():
            runs[kind].append(_run(args, tree, transactions_only))
            print(f"{kind:<8}  {json.dumps(runs[kind][-1])}", flush=True)
    medians = {
        kind: {key: round(statistics.median(r[key] for r in each), 3) for key in each[0]}
        for kind, each in runs.items()
    }
    for key in (
        "round_trips_per_1m",
        "server_cpu_ms_per_1m",
        "round_trip_wall_s_per_1m",
        "round_trip_blocked_s_per_1m",
    ):
        base, this = medians["baseline"][key], medians["this"][key]
        ratio = f"{this / base:.2f}x" if base else "-"
        print(f"{key:<28} baseline {base:>10}  this {this:>10}  ({ratio})")
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
