"""The JSON beside a lab recording (kvscope/data/FORMAT.md): how the run was made, what every
reset did, and BlockPool ground truth at labelled instants. Imports vLLM (its versions)."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import vllm
import vllm.envs as envs
from vllm.v1.core.sched.scheduler import Scheduler

from kvscope import __version__

if TYPE_CHECKING:
    from kvscope.lab.replica import LabReplica

CAPTURE_FORMAT = (
    "gzip'ed msgpack stream; one record per received ZMQ message: [recv_ts float (subscriber "
    "time.time(), wall clock), topic bin (frame0), seq bin (frame1, 8-byte big-endian), payload "
    "bin (frame2 = vLLM KVEventBatch msgpack: [ts, [events...], dp_rank])]"
)
GROUND_TRUTH_NOTE = (
    "hashes: [block_hash as published in events, group_idx, number of blocks under that key in "
    "BlockPool.cached_block_hash_to_block]; valid for the consumer state after applying every "
    "batch with seq <= published_through_seq, when pending_events == 0"
)
CLOCK_NOTE = (
    "KVEventBatch.ts = sim_epoch + simulated seconds at end of the step (patched time.time in "
    "vllm.v1.core.sched.scheduler only)"
)


def sidecar_path_for(capture: Path) -> Path:
    """`X.msgpack.gz` -> `X.json`; any other name gets `.json` appended."""
    name = capture.name
    if name.endswith(".msgpack.gz"):
        return capture.with_name(name[: -len(".msgpack.gz")] + ".json")
    return capture.with_name(name + ".json")


def replica_stats(replica: LabReplica) -> dict[str, Any]:
    """The sidecar's `stats`: what the run did, in counts and rates."""
    r, published = replica, replica.engine.published
    sim = r.sim_t or 1.0
    wall = r.wall_s or 1.0
    events = sum(published.events.values())
    return {
        "steps": r.steps,
        "wall_s": round(r.wall_s, 3),
        "setup_s": round(r.setup_s, 3),
        "sim_s": round(r.sim_t, 3),
        "steps_per_wall_s": round(r.steps / wall, 1),
        "sim_s_per_wall_s": round(r.sim_t / wall, 2),
        "requests_admitted": r.requests_admitted,
        "requests_finished": r.metrics.finished,
        "max_running": r.max_running,
        "scheduled_tokens": r.scheduled_tokens,
        "preemptions": r.preemptions,
        "requests_ever_preempted": len(r.ever_preempted),
        "idle_s": round(r.idle_s, 3),
        "idle_periods": r.idle_periods,
        "batches_published": published.batches,
        "events": events,
        "block_stored_events": published.events["BlockStored"],
        "block_stored_hashes": published.stored_hashes,
        "block_removed_events": published.events["BlockRemoved"],
        "block_removed_hashes": published.removed_hashes,
        "all_blocks_cleared_events": published.events["AllBlocksCleared"],
        "all_blocks_cleared_seqs": list(published.cleared_seqs),
        "events_per_sim_s": round(events / sim, 2),
        "batches_per_sim_s": round(published.batches / sim, 2),
    }


def build_sidecar(replica: LabReplica) -> dict[str, Any]:
    """The JSON beside a recording (see kvscope/data/FORMAT.md)."""
    e, w = replica.settings, replica.workload_spec
    data: dict[str, Any] = {}
    record_path = replica.record_path
    if record_path is not None:
        data["capture_file"] = record_path.name
        data["capture_format"] = CAPTURE_FORMAT
        if record_path.exists():
            raw = record_path.read_bytes()
            data["capture_sha256"] = hashlib.sha256(raw).hexdigest()
            data["capture_bytes"] = len(raw)
    if replica.recorder is not None:
        data["subscriber"] = replica.recorder.summary()
    data["replica"] = replica.name
    data["versions"] = {
        "vllm": str(vllm.__version__),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "kvscope": __version__,
    }
    engine = replica.engine
    data["scheduler"] = {
        "cls": f"{Scheduler.__module__}.{Scheduler.__qualname__}",
        "async_scheduling": False,
        "block_size": e.block_size,
        "num_gpu_blocks": e.num_blocks,
        "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "max_model_len": e.max_model_len,
        "enable_prefix_caching": True,
        "chunked_prefill": True,
        "hash_algo": engine.vllm_config.cache_config.prefix_caching_hash_algo,
        "kv_events_use_int_block_hashes": bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES),
        "publisher": "zmq",
        "endpoint": replica.endpoint,
        "topic": e.topic,
        "replay_endpoint": (
            None if engine.replay_port is None else f"tcp://*:{engine.replay_port}"
        ),
        "buffer_steps": e.buffer_steps,
    }
    data["workload"] = {
        "rate": w.rate,
        "duration": w.duration,
        "seed": w.seed,
        "stream": replica.stream,
        "num_sys": w.num_sys,
        "sys_prompt_lens": replica.workload.sys_prompt_lens,
        "sys_prompt_len": list(w.sys_prompt_len),
        "suffix_len": list(w.suffix_len),
        "out_len": list(w.out_len),
        "zipf_s": w.zipf_s,
        "vocab": w.vocab,
        "twin_prob": w.twin_prob,
        "aligned_prob": w.aligned_prob,
        "greedy_prob": w.greedy_prob,
        "num_requests": replica.requests_admitted,
        "step_time_model": e.step_time_model,
        "speed": replica.clock.speed,
    }
    if replica.preset is not None:
        data["workload"]["preset"] = replica.preset
    data["clock"] = {"sim_epoch": replica.sim_epoch, "ts_clock": "sim", "note": CLOCK_NOTE}
    data["resets"] = [r.as_json() for r in replica.resets]
    data["ground_truth_note"] = GROUND_TRUTH_NOTE
    data["snapshots"] = list(replica.snapshots)
    data["stats"] = replica_stats(replica)
    return data
