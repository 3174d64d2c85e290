"""How the store's writer queues, spills, batches, checkpoints and retries (storage/writer.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.storage._checkpoint_pacing import MIN_BLOCKS
from kvscope.storage.log_chunks import CHUNK_FORMAT
from kvscope.storage.recovery import DEFAULT_OFFSETS_S


@dataclass(frozen=True)
class StoreSettings:
    queue_rows: int = 50_000
    """Batch, rollup and checkpoint rows that may wait for the store; past this they are
    dropped (counted; dropped batches are marked incomplete in the store). The rare rows
    (epochs, resets, recoveries, intervals) always wait: dropping them would lose what matters."""
    queue_bytes: int = 512 << 20
    """Bytes (payloads, map snapshots) of the rows waiting in memory past which droppable rows
    go to the spill, or are dropped: a publisher's large batches cannot fill memory either."""
    rare_bytes: int = 256 << 20
    """Past this many bytes held in memory, rare rows (a reset carries its map) wait in the
    spill file, even past `spill_bytes`: they are never dropped. Without a spill they stay."""
    spill_bytes: int = 1 << 30
    """What the queue cannot hold goes to a local file up to this size (storage/spill.py),
    drained in order once the store answers: only past it are batches dropped. 0: no spill."""
    trim_after_bytes: int = 64 << 20
    """Once the rows in memory reached this many bytes and then drained, the freed heap is
    handed back to the OS (storage/heap_trim.py): RSS falls back after an outage."""
    spill_dir: str | None = None
    """Where that file lives (anonymous, removed at exit); None: the system's temp folder."""
    rows_per_transaction: int = 5_000
    """Rows a transaction takes at most for each stream the last one wrote, up to half
    `queue_rows` (storage/writer_state.py, `rows_per_take`): a fleet's streams each get a chunk
    as large as one stream's."""
    linger_s: float = 1.0
    """How long the writer lets fewer rows than it would take wait for more: a
    transaction and a log chunk per second, not per few batches, at a replica's usual rates
    (small chunks compress poorly). What waits is lost by a crash only until the restart asks
    the replay socket for it."""
    checkpoint_events_per_block: float = 8.0
    """Checkpoint once the block-events applied since the last checkpoint are this many times
    the blocks it held (counted as at least `checkpoint_min_blocks`): the
    trade between rebuilding an instant and disk. A rebuild restores a checkpoint and replays
    at most this many events per block of it, so its time follows the map's size; checkpoints
    take about their bytes per block over this of the disk per block-event, however the log
    packs. Lower rebuilds faster and stores more (benchmarks/store.py measures both); inf:
    only `checkpoint_every_batches`. The stream alone decides, never the writer's speed."""
    checkpoint_min_blocks: int = MIN_BLOCKS
    """The fewest blocks a checkpoint is counted as (storage/_checkpoint_pacing.pyx): a small
    map is checkpointed as one of this many blocks would be, its rebuilds replaying at most
    `checkpoint_events_per_block` times this many events."""
    checkpoint_every_batches: int = 20_000
    """A checkpoint at least this often (in batches), whatever the sizes."""
    checkpoint_delta_share: float = 0.0
    """A checkpoint is written as the rows changed since the last whole one (a delta) while
    that is at most this share of the mean size of the checkpoints since the whole one
    (storage/checkpoint_deltas.py: 1.0 spends the fewest bytes); 0 writes every one whole.
    Deltas take less disk, and an instant read through one rebuilds slower
    (benchmarks/store.py): opt-in."""
    log_chunk_format: int = CHUNK_FORMAT
    """The format log chunks are written in (storage/log_chunks.py): 5 (the default) splits
    each chunk's batches into columns, names the token blocks the stream's dictionary holds by
    their number there, and before a dictionary forms splits token ids into byte planes; 4 the
    same without the planes; 3 without the numbers either; 2 packs each chunk's batches whole,
    more disk, a little cheaper to pack and to replay. Every format reads."""
    log_dictionary_bytes: int = 1 << 20
    """Token content kept per stream to compress its log against (storage/log_dictionary.py);
    0 compresses without. A stream costs the writer a few times this in memory (the runs kept,
    the dictionary, zstd's tables for it, and from log chunk format 4 on an index of its blocks
    of up to about as much again): a collector of many streams may want less."""
    log_dictionary_ratio: float = 8.0
    """A new dictionary once the log stored against the current one is this many times its
    content: dictionaries take at most about 1/ratio of the log's bytes."""
    gil_switch_interval_s: float | None = 0.0005
    """Set as the process's GIL switch interval (`sys.setswitchinterval`) unless it is already
    shorter; None leaves it. The writer thread lets go of the GIL for each compression and SQL
    call; taking it back from a busy ingest thread waits out the interval (CPython's default 5
    ms), which cost the writer about as much as its own work (benchmarks/store.py)."""
    gc_young_threshold: int | None = 10_000
    """Set as the process's young-generation GC threshold unless it is already higher; None
    leaves it. Each batch's row lives until the writer takes the queue (up to
    `rows_per_transaction` a stream at a time): at CPython's 700, the ingest thread ran a young pass
    every ~700 batches (storage/gc_policy.py)."""
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0
    recovery_offsets_s: tuple[float, ...] = DEFAULT_OFFSETS_S
    shard: str | None = None
    prefix_follower_bytes: int = 2 << 30
    """About the memory the writer spends following recovering streams' prefix groups batch by
    batch (storage/prefix_followers.py): a follower holds 20-40 bytes per block of its reset's
    `before` map (a slot map of its groups' marks) and about 2 kB per prefix group, 60 per
    block of the map it follows and 140 per block stored since the clear, 128 KiB per table and
    800 per orphan recorded (a replica of 20k blocks in 140 groups, 12k back: 3 MB; a fleet of
    600 all in recovery at once: 1.8 GB). Past it (counted) a reset's groups are computed in
    full at each offset: the resets in flight are followed as long as they fit, however many."""
    prefix_followers: int | None = None
    """At most this many followers besides (None: as many as `prefix_follower_bytes` holds)."""
