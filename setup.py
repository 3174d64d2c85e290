"""Builds the compiled part of kvscope; everything else is declared in pyproject.toml.

collector/_slot_map.pyx is the block table's hash -> slot map, _token_column.pyx its tokens
packed at their bit width (the packing inline in _token_bits.pxd); collector/_table_core.pyx its
state and hot writes (its contract with block_table.py in _table_core.pxd, its removal inline in
_table_remove.pxd), _lookup.pyx the lookup by tokens over it, _admit.pyx the check of a stream's
limits before each batch;
collector/_wire_fast.pyx decodes the common vLLM batch straight from its msgpack bytes (its
msgpack reads inline in _msgpack.pxd, its scan of an event map in _wire_scan.pxd, its checks of a
batch in _wire_checks.pyx, which the fused replay's read shares), and
collector/_replay.pyx applies such batches of a rebuild's log straight to the tables (read first
by _fused_read.pyx), and
_map_apply.pyx a live batch's events, _map_counters.pyx a map's counters that both add to,
_map_core.pyx the map's fields that both read;
collector/_table_chains.pyx groups a table's blocks by chain for a reset's prefix groups (in
the order _radix_sort.pxd sorts their hashes, as _hash_sort.pyx sorts a checkpoint's),
_table_counts.pyx counts a before map's hashes against a table for a recovery point;
collector/_zmq_recv.pyx receives a whole message with libzmq's own calls, _batch_rank.pyx reads
a fleet's batch's DP rank and _fleet_route.pyx routes its usual message, _ingest_live.pyx
is a stream's live path (each message in order, applied), _live_sink.pyx the sink it tells of
each batch in C, and _fleet_drain.pyx the fleet's drain loop that feeds it;
collector/_byte_planes.pyx lays snapshot columns out as byte planes, and
collector/_checkpoint_columns.pyx drops what they repeat, _checkpoint_rows.pyx keeps a delta
checkpoint's changed rows; storage/_token_granules.pyx cuts a batch's token ids into the log
dictionary's content (msgpack's widths by first byte in _msgpack_widths.pxd), and
storage/_log_columns.pyx splits a log chunk's batches into columns and back (a chunk's packing
in _log_run.pxd, its walks in _log_walk.pxd, its buffer in _log_buf.pxd, the split's hash table
and writes without the GIL in _log_split.pxd, its columns' rooms in _log_rooms.pxd, their
reading back in _log_join.pxd, the content's note read from its split in _log_fold.pxd),
_log_planes.pyx lays its stamps and token ids out as byte
planes, _log_known.pyx its hash literals against a checkpoint's hashes (format 6), sorted by
_hash_sort.pyx,
_row_streams.pyx reads a transaction's log rows as columns, each stream's together,
_run_bounds.pyx cuts them into chunks' runs, _pg_arrays.pyx makes a table's columns
PostgreSQL's binary arrays, and
storage/_checkpoint_pacing.pyx counts each batch's block-events toward the next checkpoint,
_rollup_counts.pyx its blocks per table toward the second's rollup, _queue_core.pyx the row
queue's counts and the put of each batch, _store_sink.pyx the store writer's part of each batch
on the ingest thread, _reset_orphans.pyx a reset follower's orphans through each batch it
replays, and _frozen_new.pyx makes its answers' groups (all Cython).
Installing kvscope therefore needs a C compiler and the Python headers, as any package with an
extension built from source does.
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent


def cython_include() -> str:
    """A folder where `kvscope/collector` and `kvscope/storage` are the source's folders: Cython
    looks a cimported .pxd up by its module's installed name, which the source tree does not
    have."""
    root = HERE / "build" / "cython-include"
    for package in ("collector", "storage"):
        link = root / "kvscope" / package
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(HERE / package, target_is_directory=True)
    return str(root)


setup(
    ext_modules=cythonize(
        [
            Extension("kvscope.collector._slot_map", ["collector/_slot_map.pyx"]),
            Extension("kvscope.collector._byte_planes", ["collector/_byte_planes.pyx"]),
            Extension(
                "kvscope.collector._checkpoint_columns", ["collector/_checkpoint_columns.pyx"]
            ),
            Extension("kvscope.collector._token_column", ["collector/_token_column.pyx"]),
            Extension("kvscope.collector._checkpoint_rows", ["collector/_checkpoint_rows.pyx"]),
            Extension("kvscope.collector._table_core", ["collector/_table_core.pyx"]),
            Extension("kvscope.collector._lookup", ["collector/_lookup.pyx"]),
            Extension("kvscope.collector._admit", ["collector/_admit.pyx"]),
            Extension("kvscope.collector._table_chains", ["collector/_table_chains.pyx"]),
            Extension("kvscope.collector._table_counts", ["collector/_table_counts.pyx"]),
            Extension("kvscope.collector._wire_checks", ["collector/_wire_checks.pyx"]),
            Extension("kvscope.collector._wire_fast", ["collector/_wire_fast.pyx"]),
            Extension("kvscope.collector._fused_read", ["collector/_fused_read.pyx"]),
            Extension("kvscope.collector._replay", ["collector/_replay.pyx"]),
            Extension("kvscope.collector._map_counters", ["collector/_map_counters.pyx"]),
            Extension("kvscope.collector._map_core", ["collector/_map_core.pyx"]),
            Extension("kvscope.collector._map_apply", ["collector/_map_apply.pyx"]),
            Extension("kvscope.collector._batch_rank", ["collector/_batch_rank.pyx"]),
            Extension("kvscope.collector._fleet_route", ["collector/_fleet_route.pyx"]),
            Extension("kvscope.collector._live_sink", ["collector/_live_sink.pyx"]),
            Extension("kvscope.collector._ingest_live", ["collector/_ingest_live.pyx"]),
            Extension("kvscope.collector._fleet_drain", ["collector/_fleet_drain.pyx"]),
            Extension("kvscope.storage._token_granules", ["storage/_token_granules.pyx"]),
            Extension("kvscope.storage._granules", ["storage/_granules.pyx"]),
            Extension("kvscope.storage._content_ids", ["storage/_content_ids.pyx"]),
            Extension("kvscope.storage._log_columns", ["storage/_log_columns.pyx"]),
            Extension("kvscope.storage._row_streams", ["storage/_row_streams.pyx"]),
            Extension("kvscope.storage._pg_arrays", ["storage/_pg_arrays.pyx"]),
            Extension("kvscope.storage._run_bounds", ["storage/_run_bounds.pyx"]),
            Extension("kvscope.storage._log_planes", ["storage/_log_planes.pyx"]),
            Extension("kvscope.storage._log_known", ["storage/_log_known.pyx"]),
            Extension("kvscope.storage._hash_sort", ["storage/_hash_sort.pyx"]),
            Extension("kvscope.storage._checkpoint_pacing", ["storage/_checkpoint_pacing.pyx"]),
            Extension("kvscope.storage._rollup_counts", ["storage/_rollup_counts.pyx"]),
            Extension("kvscope.storage._queue_core", ["storage/_queue_core.pyx"]),
            Extension("kvscope.storage._store_sink", ["storage/_store_sink.pyx"]),
            Extension("kvscope.storage._reset_orphans", ["storage/_reset_orphans.pyx"]),
            Extension("kvscope.storage._frozen_new", ["storage/_frozen_new.pyx"]),
            # dlopen/dlsym: libdl before glibc 2.34, an empty stub after.
            Extension("kvscope.collector._zmq_recv", ["collector/_zmq_recv.pyx"], libraries=["dl"]),
        ],
        compiler_directives={"language_level": "3"},
        include_path=[cython_include()],
    )
)
