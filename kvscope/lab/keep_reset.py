"""The proposed `keep_running_requests` reset, which no vLLM release has. Implemented here
only: the lab's HTTP API, its scheduled resets and the tests all reset through it."""

from __future__ import annotations

from vllm.distributed.kv_events import AllBlocksCleared
from vllm.v1.core.block_pool import BlockHashToBlockMap
from vllm.v1.core.sched.scheduler import Scheduler


def keep_running_reset(scheduler: Scheduler, reset_external: bool = False) -> bool:
    """Reset the prefix cache and leave the running requests their blocks.

    `BlockPool.reset_prefix_cache` without its all-blocks-free guard, for each pool once (as
    the coordinator resets them), then what the KVCacheManager and the Scheduler do after a
    reset succeeds: every hash leaves the lookup, reuse watchers are told, every block forgets
    its hash, the pool's metrics restart, one AllBlocksCleared is queued. Held blocks keep their
    reference counts and stay in the running requests' block tables: those requests continue,
    their next full blocks are stored with a parent that is no longer cached, and their old
    blocks, reused later, emit no BlockRemoved (they have no hash any more).
    """
    manager = scheduler.kv_cache_manager
    pools = dict.fromkeys(m.block_pool for m in manager.coordinator.single_type_managers)
    for pool in pools:
        pool.cached_block_hash_to_block = BlockHashToBlockMap()  # type: ignore[no-untyped-call,unused-ignore]
        pool.cached_block_hashes_by_block.clear()
        if pool._reuse_watchers:
            pool._notify_reuse([pool.blocks[i] for i in list(pool._reuse_watchers)])
        for block in pool.blocks:
            block.reset_hash()  # type: ignore[no-untyped-call,unused-ignore]
        if pool.metrics_collector:
            pool.metrics_collector.reset()
        if pool.enable_kv_cache_events:
            pool.kv_event_queue.append(AllBlocksCleared())
    if manager.log_stats and manager.prefix_cache_stats is not None:
        manager.prefix_cache_stats.reset = True
    success = bool(scheduler.reset_connector_cache()) if reset_external else True
    if success and scheduler.aux_output_connector is not None:
        scheduler.aux_output_connector.reset()
    return success
