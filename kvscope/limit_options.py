"""A stream's limits (collector/limits.py) as flags of the commands that collect: each over its
environment variable over the config file's `[collector]` key of the same name."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from kvscope.collector.limits import DEFAULT_LIMITS
from kvscope.config import Config


def _limit(name: str, what: str) -> Any:  # typer's OptionInfo
    return typer.Option(
        envvar=f"KVSCOPE_{name.upper()}",
        min=1,
        help=f"{what}: a batch that would take a stream past it is refused "
        f"(limit_exceeded). Default: [collector] {name}, else {getattr(DEFAULT_LIMITS, name)}.",
        show_default=False,
    )


MaxBlockSizeOpt = Annotated[
    int | None, _limit("max_block_size", "Tokens per block a BlockStored may declare")
]
MaxTablesOpt = Annotated[
    int | None, _limit("max_tables_per_stream", "(medium, group) tables per stream")
]
MaxBlocksOpt = Annotated[
    int | None, _limit("max_blocks_per_stream", "Cached blocks per stream, over its tables")
]
MaxTokenBytesOpt = Annotated[
    int | None,
    _limit("max_token_bytes_per_stream", "Bytes of block contents per stream, over its tables"),
]


def with_limit_flags(
    config: Config,
    max_block_size: int | None,
    max_tables_per_stream: int | None,
    max_blocks_per_stream: int | None,
    max_token_bytes_per_stream: int | None,
) -> Config:
    """The file's limits with each flag (or its environment variable) that was given on top."""
    given = {
        "max_block_size": max_block_size,
        "max_tables_per_stream": max_tables_per_stream,
        "max_blocks_per_stream": max_blocks_per_stream,
        "max_token_bytes_per_stream": max_token_bytes_per_stream,
    }
    collector = config.collector
    limits = dataclasses.replace(
        collector.limits, **{k: v for k, v in given.items() if v is not None}
    )
    return dataclasses.replace(config, collector=dataclasses.replace(collector, limits=limits))
