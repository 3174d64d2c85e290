# When a stream's next checkpoint is due: paced by the stream's own block-events.
#
# A checkpoint is due once the block-events applied since the last one reach `per_block` times
# the blocks cached at that one (counted as at least `min_blocks`), or after `every_batches`
# batches, or when forced (after a hole in the log). Rebuilding an instant restores a checkpoint
# (a cost that follows its blocks) and replays the log after it (one that follows the events
# replayed), so both grow with the map, not with the stream's length; and the checkpoints' share
# of the disk is about their bytes per block over `per_block`, however the log packs.
#
# Only the stream decides: the same stream gets the same checkpoints whatever the writer
# thread's speed (it tells the pacer nothing), at any playback speed and under any load.
# In Cython: the count runs on the ingest thread for every batch.

MIN_BLOCKS = 2048
"""The fewest blocks a checkpoint is counted as, unless told otherwise: a small map (a stream's
start, after a clear, a lab replica of a few hundred blocks) is checkpointed no more often than
one of this many blocks would be. Its rebuilds replay at most `per_block` times this many
events; checkpointed by its own size, a short recording's checkpoints took a good part of its
disk (benchmarks/store.py)."""


cdef class CheckpointPacer:
    # (its fields: storage/_checkpoint_pacing.pxd)

    def __init__(self, double per_block, long long every_batches, double min_blocks=MIN_BLOCKS):
        self.per_block = per_block
        self.min_blocks = min_blocks
        self.every_batches = every_batches
        self.batches_since = 0
        self.events_since = 0
        self.due_events = per_block * min_blocks

    cpdef bint counted(self, long long events):
        """Count one batch of `events` block-events (as the rollup counted them); whether a
        checkpoint is due."""
        self.events_since += events
        self.batches_since += 1
        return self.events_since >= self.due_events or self.batches_since >= self.every_batches

    def force(self):
        """A checkpoint is due at the next batch, whatever was counted (after a hole)."""
        self.due_events = 0

    def queued(self, long long blocks):
        """A checkpoint of a map of `blocks` blocks was queued."""
        self.batches_since = 0
        self.events_since = 0
        self.due_events = self.per_block * max(<double>blocks, self.min_blocks)
