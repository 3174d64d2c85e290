"""What the store costs a collector per replica-second in a fleet, in instructions counted by
callgrind: the ingest thread's sink part and the writer thread's, a figure that holds still on a
shared machine.

    python benchmarks/fleet_store_instructions.py [--publishers 10] [--fleet 200] [--seed 1]
                                  [--windows start:0:5,steady:30:35] [--store sqlite]
                                  [--parts] [--native] [--annotate DIR]
                                  [--reset-every 40] [--per-reset]

The stream is benchmarks/fleet.py's (one replica's batches at an H200's rate, a reset every 40 s
of it), played by `--publishers` publishers with llm-d topics, round-robin, each from seq 0, each
batch received at its place in the stream (its block-events over the rate). Each message goes
through `FleetRouter.route_batch` and its stream's `StreamIngest.live_frames` into the store's
writer (`StoreWriter`, default settings, on a fresh `--store`), whose thread is replaced by the
same steps run in line: it takes the queue once it holds a transaction's rows, once its oldest
row has lingered `linger_s` of the stream's time, or when a rare row hurries it. The take points
thus depend on the stream only; with a thread they depend on timing, and nothing stored does.

A fleet of `--fleet` replicas fills a transaction `--fleet` times as fast as one replica: the
publishers' transactions are cut to the fleet's (`writer_state.rows_per_take`, or
`rows_per_transaction` where it is missing) times `publishers / fleet` rows, so that each
stream's share of a transaction (its chunk, its rollups) is the fleet's. A transaction's own
fixed cost (its begin and commit) is then spread over `--publishers` replicas, not `--fleet`:
the figures overstate it by `fleet / publishers`; the last line of a window gives the writer's
count per transaction.

Each window (`name:from:to`, seconds of the stream) is counted, in runs of its own, as:
- `memory`: the ingest without a sink (the baseline);
- `ingest`: the ingest with the store's writer (the sink's part is this less `memory`);
- `writer`: the writer's transactions taken within the window (prepare and commit);
- with `--parts`, parts of `writer`: `prepare` (packing, checkpoint encoding), `pack` (the log
  into chunks, and its dictionaries), `chunks` (the packing alone), `dictionary` (new
  dictionaries made), `checkpoints` (their encoding), `sql` (the transaction's statements).
- with `--parts`, the reset's parts of `writer` too: `logged` (each transaction's batches
  held for the followers, `PrefixFollowers.logged`), `groups` (the prefix groups followed at
  each recovery row, `PrefixFollowers.groups`), `reads` (the log chunks opened for them and
  for the rebuilds they start from, `batch_log.open_chunk`), `before` (the reset's `before`
  map encoded), and the steps of `groups`: `start` (a follower made, `ResetFollower()`), within
  it `after_clear` (the map just after the clear) and `chains` (the `before` map grouped);
  `advance` (the batches fed), within it `orphans` (`Orphans.after`) and `states` (the
  groups counted at an offset); `result` (an answer made), `offsets` (the offsets read); and
  `store` (an answer written to `reset_prefix_groups`).
- with `--parts`, the sink's calls on the ingest thread too (parts of `ingest`): `applied`
  (each batch), `instant` (the map before a batch), `cleared` (a clear: also per reset) and
  `checkpoint` (a checkpoint's copy of the map).
`--reset-every` sets the stream's reset interval (seconds of a replica's stream): the default
windows hold none at 40 s. `--per-reset` plays each window twice more, without resets, and
prints the writer's count per reset (the difference over the resets the window holds).
It prints instructions per replica-second of each. `--native` runs each once without valgrind
and prints seconds (noisy; for a quick look). `--annotate DIR` keeps callgrind's files there.
Needs valgrind.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import msgspec
from _callgrind import collected, need_valgrind, run_child, say_source, source

HERE = Path(__file__).resolve().parent
RATE = 2500.0
"""Block-events a second per replica: an H200's (benchmarks/fleet.py's default)."""
RESET_EVERY_S = 40.0
CLOCK_START = 1_796_051_000.0
KINDS = ("memory", "ingest", "writer")
PARTS = ("prepare", "pack", "chunks", "dictionary", "checkpoints", "sql")
RESET_PARTS = (
    "logged",
    "groups",
    "reads",
    "before",
    "start",
    "after_clear",
    "chains",
    "advance",
    "orphans",
    "states",
    "result",
    "offsets",
    "store",
)
INGEST_PARTS = ("applied", "instant", "cleared", "checkpoint")
"""The sink's calls on the ingest thread (`StoreWriter`'s): each batch, the map before a batch,
a clear, a checkpoint's copy."""
NO_RESETS_S = 1e9
"""`--per-reset`'s baseline: the same stream's batches with no reset in reach."""

_sources: set[str] = set()
"""Where the children's kvscope came from (printed: a baseline run through a shim says so)."""
_counting = False
_seconds = 0.0
"""The time spent in counted calls (what `--native` prints)."""


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, counted by callgrind (inside `deque_init`) while `_counting`."""

    def run(*args: Any, **kwargs: Any) -> Any:
        global _seconds
        if not _counting:
            return fn(*args, **kwargs)
        out: list[Any] = []
        began = time.perf_counter()
        deque(map(lambda _: out.append(fn(*args, **kwargs)), (None,)), maxlen=0)
        _seconds += time.perf_counter() - began
        return out[0]

    return run


def _patch(part: str) -> None:
    """The writer with `part` counted (a class's method or a module's function; of a reset's
    steps, the first of the candidates the code has: they moved between versions)."""
    from kvscope.storage import (
        batch_log,
        log_packer,
        prefix_followers,
        reset_follower,
        reset_orphans,
        sql_writer,
    )
    from kvscope.storage.checkpoint_deltas import CheckpointEncoder
    from kvscope.storage.log_dictionary import StreamContent
    from kvscope.storage.prefix_followers import PrefixFollowers
    from kvscope.storage.reset_follower import ResetFollower
    from kvscope.storage.sql_writer import RowWriter
    from kvscope.storage.writer import StoreWriter

    known: Any = prefix_followers  # where a reset's kept offsets were read back before
    with suppress(ImportError):
        known = importlib.import_module("kvscope.storage.recovery_known")
    targets: dict[str, tuple[tuple[Any, str], ...]] = {
        "prepare": ((RowWriter, "prepare"),),
        "pack": ((log_packer.LogPacker, "pack"),),
        "chunks": ((log_packer, "pack"),),
        "dictionary": ((StreamContent, "refresh"),),
        "checkpoints": ((CheckpointEncoder, "encode"),),
        "sql": ((RowWriter, "write"),),
        "logged": ((PrefixFollowers, "logged"),),
        "groups": ((PrefixFollowers, "groups"),),
        "reads": ((batch_log, "open_chunk"),),
        "before": ((sql_writer, "encode_before"), (sql_writer, "encode_copy")),
        "start": ((ResetFollower, "__init__"),),
        "after_clear": ((reset_follower, "map_after_clear"), (reset_follower, "rebuild")),
        "chains": ((reset_follower, "chain_groups"),),
        "advance": ((ResetFollower, "advance"),),
        "orphans": ((reset_orphans.Orphans, "after"),),
        "states": ((ResetFollower, "_state"),),
        "result": ((ResetFollower, "result"),),
        "offsets": ((known, "offsets_reached"),),
        "store": (
            (prefix_followers, "write_prefix_groups"),
            (sql_writer, "store_prefix_groups"),
        ),
        "applied": ((StoreWriter, "applied"),),
        "instant": ((StoreWriter, "instant"),),
        "cleared": ((StoreWriter, "map_cleared"),),
        "checkpoint": ((StoreWriter, "_checkpoint"),),
    }
    owner, name = next((o, n) for o, n in targets[part] if hasattr(o, n))
    setattr(owner, name, _counted(getattr(owner, name)))


def _fleet_take(settings: Any, fleet: int) -> int:
    """The most rows a transaction of a fleet of `fleet` streams takes (before
    `writer_state.rows_per_take`: `rows_per_transaction`, whatever the streams)."""
    from kvscope.storage import writer_state

    per_take = getattr(writer_state, "rows_per_take", None)
    return settings.rows_per_transaction if per_take is None else int(per_take(settings, fleet))


def _messages(
    payloads: list[bytes], cum: list[int], publishers: int
) -> Iterator[tuple[float, list[bytes]]]:
    """(stream seconds, [topic, seq, payload]) of every publisher's batches in turn."""
    topics = [f"kv@127.0.0.1:{6000 + p}@fleet".encode() for p in range(publishers)]
    for seq, payload in enumerate(payloads):
        at = cum[seq] / RATE
        for topic in topics:
            yield at, [topic, seq.to_bytes(8, "big"), payload]


def child(
    kind: str, data_file: str, url: str, publishers: int, fleet: int, window: tuple[float, float]
) -> dict[str, float]:
    """Play the stream to the window's end, counting `kind` within the window."""
    global _counting
    from kvscope.collector import prefix_map
    from kvscope.collector.fleet import FleetSettings
    from kvscope.collector.fleet_router import FleetRouter
    from kvscope.collector.ingest import StreamIngest
    from kvscope.collector.types import StreamId
    from kvscope.storage import write_loop
    from kvscope.storage.engine import open_store
    from kvscope.storage.store_settings import StoreSettings
    from kvscope.storage.writer import StoreWriter

    say_source(prefix_map.__file__)
    payloads, cum = msgspec.msgpack.decode(Path(data_file).read_bytes())
    write_loop.WriteLoop._run = lambda self: None  # type: ignore[method-assign]
    if kind in PARTS or kind in RESET_PARTS or kind in INGEST_PARTS:
        _patch(kind)
    defaults = StoreSettings()
    rows_per_take = max(1, round(_fleet_take(defaults, fleet) * publishers / fleet))
    writer = None if kind == "memory" else StoreWriter(open_store(url))
    loop = None if writer is None else writer._loop
    queue = None if writer is None else writer._queue
    router = FleetRouter(FleetSettings(bind="tcp://127.0.0.1:5557"))
    ingests: dict[StreamId, StreamIngest] = {}
    counts: dict[str, float] = {"messages": 0, "transactions": 0, "rows": 0}

    def step(message: list[bytes], recv: float) -> None:
        # FleetDrain.drain, without the socket
        to, batch = router.route_batch(message)
        assert to is not None
        if to.new:
            ingests[to.stream] = StreamIngest(to.stream, can_replay=False, sink=writer)
        ingests[to.stream].live_frames(message, recv, batch)

    def write() -> None:
        # WriteLoop._run's body, once
        assert loop is not None and queue is not None
        queue.hurry()  # what is queued, now: the stream's time decided the take
        rows = queue.take(rows_per_take)
        assert rows is not None
        counts["rows"] += len(rows)
        queue.done(loop._write_rows(rows))

    count_ingest = _counted(step) if kind in ("memory", "ingest") else step
    count_write = _counted(write) if kind == "writer" else write
    oldest: float | None = None
    start, end = window
    for at, message in _messages(payloads, cum, publishers):
        if at >= end:
            break
        _counting = at >= start
        count_ingest(message, CLOCK_START + at)
        if queue is None:
            continue
        counts["messages"] += _counting

        pending = len(queue._rows)
        if pending and oldest is None:
            oldest = at
        if pending and (
            pending >= rows_per_take
            or queue._hurry.is_set()
            or (oldest is not None and at - oldest >= defaults.linger_s)
        ):
            count_write()
            counts["transactions"] += _counting
            queue._hurry.clear()
            oldest = at if queue._rows else None
    _counting = False
    counts["seconds"] = _seconds
    if queue is None:
        counts["messages"] = sum(1 for at, _ in _messages(payloads, cum, 1) if start <= at < end)
        counts["messages"] *= publishers
    print(f"counts {msgspec.json.encode(counts).decode()}", file=sys.stderr)
    return counts


def counted_child(
    kind: str, args: list[str], out_dir: str, native: bool
) -> tuple[float, dict[str, float]]:
    """(instructions, or seconds with `native`; the child's counts)."""
    name = "quiet" if args[0].endswith("quiet.msgpack") else kind
    out_file = None if native else f"{out_dir}/{name}-{args[-1]}.out"
    stderr = run_child([sys.executable, __file__, "--child", kind, *args], out_file)
    _sources.add(source(stderr))
    counted = re.search(r"counts (\{.*\})", stderr)
    assert counted, stderr
    counts: dict[str, float] = msgspec.json.decode(counted.group(1))
    if native:
        return counts["seconds"], counts
    return float(collected(stderr)), counts


def _store_url(store: str, stack: ExitStack, tmp: str, n: int) -> str:
    if store == "sqlite":
        return f"sqlite:///{Path(tmp) / f'store{n}.sqlite'}"
    sys.path.insert(0, str(HERE))
    from _pg import database_url, fresh_database

    return database_url(stack.enter_context(fresh_database("fleetstore_")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=10, help="replicas played")
    parser.add_argument("--fleet", type=int, default=200, help="replicas modelled")
    parser.add_argument("--windows", default="start:0:5,steady:30:35")
    parser.add_argument("--store", default="sqlite", choices=("sqlite", "postgresql"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parts", action="store_true", help="also the writer's parts")
    parser.add_argument("--kinds", help="only these runs (comma-separated)")
    parser.add_argument("--native", action="store_true", help="seconds, without valgrind")
    parser.add_argument("--annotate", help="keep callgrind's files in this folder")
    parser.add_argument(
        "--reset-every", type=float, default=RESET_EVERY_S, help="seconds between resets"
    )
    parser.add_argument(
        "--per-reset", action="store_true", help="also the writer without resets: per reset"
    )
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, data_file, url, p, f, a, b = args.child
        child(kind, data_file, url, int(p), int(f), (float(a), float(b)))
        return
    if not args.native:
        need_valgrind("fleet_store_instructions.py")
    sys.path.insert(0, str(HERE))
    from _ingest_stream import VllmAllBlocksCleared, VllmEventBatch
    from fleet import fleet_stream

    windows = []
    for spec in args.windows.split(","):
        name, a, b = spec.split(":")
        windows.append((name, float(a), float(b)))
    seconds = max(b for _, _, b in windows) + 1
    stream = fleet_stream(RATE, seconds, args.seed, args.reset_every)
    quiet = fleet_stream(RATE, seconds, args.seed, NO_RESETS_S) if args.per_reset else None
    decode = msgspec.msgpack.Decoder(VllmEventBatch).decode
    clears = [
        c / RATE
        for c, payload in zip(stream.cum_events, stream.payloads, strict=True)
        if any(isinstance(e, VllmAllBlocksCleared) for e in decode(payload).events)
    ]
    p = args.publishers
    kinds = (*KINDS, *PARTS, *RESET_PARTS, *INGEST_PARTS) if args.parts else KINDS
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
    unit = "s" if args.native else "instructions"
    print(
        f"stream: {len(stream.payloads):,} batches a publisher, {p} publishers modelling a "
        f"fleet of {args.fleet}"
    )
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        out_dir = args.annotate or tmp
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        data_file = str(Path(tmp) / "stream.msgpack")
        Path(data_file).write_bytes(msgspec.msgpack.encode([stream.payloads, stream.cum_events]))
        quiet_file = str(Path(tmp) / "quiet.msgpack")
        if quiet is not None:
            Path(quiet_file).write_bytes(msgspec.msgpack.encode([quiet.payloads, quiet.cum_events]))
        n = 0
        for name, a, b in windows:
            replica_s = p * (b - a)
            figures: dict[str, float] = {}
            txs = 0.0
            for kind in kinds:
                n += 1
                url = _store_url(args.store, stack, tmp, n)
                child_args = [data_file, url, str(p), str(args.fleet), str(a), str(b)]
                figures[kind], counts = counted_child(kind, child_args, out_dir, args.native)
                if kind == "writer":
                    txs = counts["transactions"]
            resets = p * sum(1 for at in clears if a <= at < b)
            quiet_txs = 0.0
            if quiet is not None:
                n += 1
                url = _store_url(args.store, stack, tmp, n)
                child_args = [quiet_file, url, str(p), str(args.fleet), str(a), str(b)]
                quiet_writer, counts = counted_child("writer", child_args, out_dir, args.native)
                quiet_txs = counts["transactions"]
            print(f"{name} ({a:g}-{b:g} s of the stream, {txs:g} transactions, {resets} resets):")
            per = {k: v / replica_s for k, v in figures.items()}
            scale = 1e3 if args.native else 1
            what = "ms" if args.native else "instructions"
            print(f"  ({what} per replica-second)")
            if "memory" in per:
                print(f"  {'memory':<12} {per['memory'] * scale:12,.1f}")
            if "ingest" in per and "memory" in per:
                print(f"  {'sink':<12} {(per['ingest'] - per['memory']) * scale:12,.1f}")
            if "writer" in per:
                print(f"  {'writer':<12} {per['writer'] * scale:12,.1f}")
            for part in (*PARTS, *INGEST_PARTS):
                if part in per:
                    print(f"    {part:<10} {per[part] * scale:12,.1f}")
            if txs:
                print(f"  ({unit} per transaction: {figures['writer'] / txs:,.4g})")
            if quiet is not None and resets and "writer" in figures:
                extra = figures["writer"] - quiet_writer
                print(
                    f"  without resets: writer {quiet_writer / replica_s * scale:,.1f} per "
                    f"replica-second, {quiet_txs:g} transactions; per reset: "
                    f"{extra / resets:,.4g} {unit}"
                )
            if resets:  # (a part alone, `--kinds store`, is a quick measurement of its own)
                for part in (*RESET_PARTS, "cleared"):
                    if part in figures:
                        print(f"    {part:<10} {figures[part] / resets:12,.4g} {unit} per reset")
    print(f"kvscope from {', '.join(sorted(_sources))}")


if __name__ == "__main__":
    main()
