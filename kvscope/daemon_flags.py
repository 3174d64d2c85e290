"""The flags both daemons, `kvscope collect` and `kvscope serve`, take over the config file: one
chain."""

from __future__ import annotations

from kvscope.config import Config
from kvscope.limit_options import with_limit_flags
from kvscope.options import with_fleet_flags, with_lease_flags, with_store_flags


def with_daemon_flags(
    config: Config,
    *,
    store: str | None,
    shard: str | None,
    lease: bool | None,
    lease_ttl: float | None,
    lease_renew: float | None,
    spill_bytes: int | None,
    spill_dir: str | None,
    log_dictionary_bytes: int | None,
    bind: str | None,
    topic_pattern: str | None,
    replica_format: str | None,
    replay_template: str | None,
    gone_after: float | None,
    max_block_size: int | None,
    max_tables_per_stream: int | None,
    max_blocks_per_stream: int | None,
    max_token_bytes_per_stream: int | None,
) -> Config:
    """`config` with each store, lease, fleet and limit flag that was given on top (keywords
    only: the commands' flags share these names, so none can land in another's place)."""
    config = with_store_flags(
        config, store, shard, spill_bytes, spill_dir, lease, log_dictionary_bytes
    )
    config = with_lease_flags(config, lease_ttl, lease_renew)
    config = with_fleet_flags(
        config, bind, topic_pattern, replica_format, replay_template, gone_after
    )
    return with_limit_flags(
        config,
        max_block_size,
        max_tables_per_stream,
        max_blocks_per_stream,
        max_token_bytes_per_stream,
    )
