"""Named load models: a workload and an engine that together behave like a known server.

`keep-reset-study`: the server of the published study that the keep-running reset answers.
What the study says of it: at 3 req/s it was idle (no KV cache block held) 0.8 times a minute
and a preempting reset restarted about 8 requests; at 4 req/s it was never idle in 11 minutes
and a preempting reset restarted about 21. By Little's law (requests running = arrival rate x
time in the server) a request spent about 8 / 3 = 2.7 s in it at 3 req/s and 21 / 4 = 5.2 s at
4 req/s: twice the time for a third more load, so at 4 req/s the server was near the most it
could serve, each further request slowing all the others.

The load model: every running request decodes one token a step, and a step takes BASE +
PER_REQUEST x requests in the batch + PER_TOKEN x scheduled tokens. With O output tokens a
request then spends about W = O x BASE / (1 - rate x O x PER_REQUEST) in the server, and the two
times above give O x BASE ~ 0.9-1 s and O x PER_REQUEST ~ 0.2 s: O = 44 (32 to 56 tokens),
BASE = 21 ms, PER_REQUEST = 4.6 ms (calibrated in simulated runs with `kvscope.lab.study`; the
README has what they give). Only these products are fixed: a longer output with a shorter step
would do as well. The growth is per request (each sequence's attention over its own context),
not per token: were it per token, every prefill would stall every running request, and the
batch would swing far wider than the study's (it would empty and flood in turn). PER_TOKEN is
small (0.02 ms: prefill is cheap), so the prompts matter little and stay the lab's default
(four shared system prompts of 96-256 tokens, then 32-256 more). The KV cache (2000 blocks of
16 tokens) is big enough that the running requests never run short at 4 req/s (no KV-full
preemption), and small enough to refill within a minute of a reset; max_num_seqs stays vLLM's
256, never the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvscope.lab.settings import EngineSettings
from kvscope.lab.workload import WorkloadSpec, parse_range


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    workload: WorkloadSpec
    engine: EngineSettings


KEEP_RESET_STUDY = Preset(
    name="keep-reset-study",
    summary="as busy as the keep-running reset study's server: run it at 3 or 4 req/s",
    workload=WorkloadSpec(rate=3.0, out_len=(32, 56)),
    engine=EngineSettings(
        num_blocks=2000,
        max_num_seqs=256,
        step_base_s=0.021,
        step_per_token_s=2e-5,
        step_per_seq_s=4.6e-3,
    ),
)

PRESETS = {p.name: p for p in (KEEP_RESET_STUDY,)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        choices = ", ".join(PRESETS)
        raise ValueError(f"preset {name!r}: expected one of {choices}") from None


@dataclass(frozen=True)
class LoadFlags:
    """The `kvscope lab` flags that shape the load and the engine; None: not given."""

    seed: int = 7
    topic: str = "kv-events"
    rate: float | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    num_sys: int | None = None
    sys_prompt_len: str | None = None
    suffix_len: str | None = None
    out_len: str | None = None
    step_time: str | None = None
    """BASE,PER_TOKEN[,PER_REQUEST] seconds."""


def parse_step_time(spec: str) -> tuple[float, float, float]:
    parts = [p.strip() for p in spec.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError as exc:
        raise ValueError(f"step time {spec!r}: expected BASE,PER_TOKEN[,PER_REQUEST]") from exc
    if len(values) not in (2, 3) or min(values) < 0:
        raise ValueError(f"step time {spec!r}: expected BASE,PER_TOKEN[,PER_REQUEST] >= 0")
    base, per_token, *rest = values
    return base, per_token, rest[0] if rest else 0.0


def build_load(preset: str | None, flags: LoadFlags) -> tuple[WorkloadSpec, EngineSettings]:
    """The workload and engine settings of `preset` (or the defaults), with the flags given
    applied over them. max_model_len grows to fit the longest request."""
    base = get_preset(preset) if preset is not None else None
    w = base.workload if base is not None else WorkloadSpec()
    e = base.engine if base is not None else EngineSettings()
    f = flags
    workload = replace(
        w,
        seed=f.seed,
        rate=w.rate if f.rate is None else f.rate,
        num_sys=w.num_sys if f.num_sys is None else f.num_sys,
        sys_prompt_len=w.sys_prompt_len
        if f.sys_prompt_len is None
        else parse_range(f.sys_prompt_len),
        suffix_len=w.suffix_len if f.suffix_len is None else parse_range(f.suffix_len),
        out_len=w.out_len if f.out_len is None else parse_range(f.out_len),
        block_size=e.block_size if f.block_size is None else f.block_size,
    )
    step = (
        (e.step_base_s, e.step_per_token_s, e.step_per_seq_s)
        if f.step_time is None
        else parse_step_time(f.step_time)
    )
    engine = replace(
        e,
        topic=f.topic,
        num_blocks=e.num_blocks if f.num_blocks is None else f.num_blocks,
        block_size=workload.block_size,
        max_num_seqs=e.max_num_seqs if f.max_num_seqs is None else f.max_num_seqs,
        max_model_len=max(e.max_model_len, workload.max_request_tokens),
        step_base_s=step[0],
        step_per_token_s=step[1],
        step_per_seq_s=step[2],
    )
    return workload, engine
