"""Builds vLLM's v1 `Scheduler` with no model: its config, its KV cache and its publisher.

As vLLM's own scheduler tests build it (tests/v1/core/utils.py in its sdist): a `ModelConfig`
read from a folder holding only a small config.json (no weights, no tokenizer), one KV cache
group of full attention with N blocks and no tensors, chunked prefill on, async scheduling
off, KV events on a `ZmqEventPublisher` (`tcp://*:PORT`, PORT + the DP rank, as vLLM binds it).

Importing this module imports vLLM (slow).
"""

from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import zmq
from vllm.config import CacheConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.lab.ports import free_port, wait_port_free
from kvscope.lab.settings import EngineSettings

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 32_000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float16",
}
"""A two-layer Llama config.json with no weights: all ModelConfig needs."""


def write_model(folder: Path) -> None:
    """The model folder `ModelConfig` reads: TINY_LLAMA's config.json and nothing else."""
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))


def kv_cache_config(settings: EngineSettings) -> KVCacheConfig:
    """One group of full attention over the model's two layers, `num_blocks` blocks."""
    return KVCacheConfig(
        num_blocks=settings.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                FullAttentionSpec(
                    block_size=settings.block_size,
                    num_kv_heads=TINY_LLAMA["num_key_value_heads"],
                    head_size=TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"],
                    dtype=torch.float16,
                ),
            )
        ],
    )


def vllm_config(
    settings: EngineSettings,
    model_dir: Path,
    endpoint: str,
    replay_endpoint: str | None,
    rank: int = 0,
) -> VllmConfig:
    e = settings
    config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir),
            served_model_name=e.served_model_name,
            skip_tokenizer_init=True,
            dtype="float16",
            max_model_len=e.max_model_len,
        ),
        scheduler_config=SchedulerConfig(
            max_model_len=e.max_model_len,
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=False,
        ),
        cache_config=CacheConfig(block_size=e.block_size, enable_prefix_caching=True),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=endpoint,
            replay_endpoint=replay_endpoint,
            buffer_steps=e.buffer_steps,
            topic=e.topic,
        ),
    )
    # One DP rank of an engine: its publisher binds the base ports + rank. (Setting the rank
    # through ParallelConfig would ask for a whole data-parallel deployment.)
    config.parallel_config.data_parallel_index = rank
    config.cache_config.num_gpu_blocks = e.num_blocks
    register_all_kvcache_specs(config)  # type: ignore[no-untyped-call,unused-ignore]
    return config


@dataclass
class BuiltScheduler:
    scheduler: Scheduler
    config: VllmConfig
    port: int
    """The port the publisher bound (base port + rank); 0 when it connects (`publish_to`)."""
    replay_port: int | None


def build_scheduler(
    settings: EngineSettings,
    model_dir: Path,
    port: int = 0,
    replay_port: int | None = 0,
    rank: int = 0,
    timeout: float = 5.0,
    publish_to: str | None = None,
) -> BuiltScheduler:
    """vLLM's Scheduler, its publisher bound to `port` + `rank` (and `replay_port` + `rank`).

    `publish_to` (a concrete `tcp://host:port`): the publisher connects there instead, as in
    a fleet (vLLM connects when the endpoint has no wildcard); its replay socket still binds.

    Ports 0: chosen by the OS, chosen again if another socket took one first. A given port
    still held by a closed publisher (libzmq closes asynchronously) is waited for.
    """
    deadline = time.monotonic() + timeout
    while True:
        # Bound ports: vLLM adds the rank to the base port it is given.
        bound = 0 if publish_to else port + rank if port else free_port()
        bound_replay = None
        if replay_port is not None:
            bound_replay = replay_port + rank if replay_port else free_port(exclude=[bound])
        if port and not publish_to:
            wait_port_free(bound, timeout)
        if replay_port:
            assert bound_replay is not None
            wait_port_free(bound_replay, timeout)
        config = vllm_config(
            settings,
            model_dir,
            publish_to or f"tcp://*:{bound - rank}",
            None if bound_replay is None else f"tcp://*:{bound_replay - rank}",
            rank,
        )
        try:
            scheduler = Scheduler(
                vllm_config=config,
                kv_cache_config=kv_cache_config(settings),
                structured_output_manager=StructuredOutputManager(config),
                block_size=settings.block_size,
                hash_block_size=settings.block_size,
                include_finished_set=False,
                log_stats=True,
            )
        except zmq.ZMQError as exc:  # another socket took a port first: try again
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        return BuiltScheduler(scheduler, config, bound, bound_replay)
