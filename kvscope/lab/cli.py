"""The `kvscope lab` command. Hook it into the main app with `register_lab(app)`.

Importing this module does not import vLLM: the command loads `kvscope.lab.runner` (and with
it vLLM) only when it runs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from kvscope.lab.presets import PRESETS, LoadFlags, build_load
from kvscope.lab.report import ReplicaSummary, modes_table, replicas_table, resets_table
from kvscope.lab.workload import (
    ResetMode,
    ScheduledReset,
    parse_mode,
    parse_resets,
    periodic_resets,
)
from kvscope.options import JsonOpt, fail
from kvscope.signals import stop_on_signals
from kvscope.tables import show_table

if TYPE_CHECKING:
    from kvscope.lab.replica import LabReplica

console = Console()
err = Console(stderr=True)


def build_schedule(
    resets: str | None, reset_every: float | None, mode: str, duration: float | None
) -> list[ScheduledReset]:
    """`--resets` and `--reset-every/--mode` -> one sorted schedule."""
    schedule = parse_resets(resets) if resets else []
    if reset_every is not None:
        if duration is None:
            raise ValueError("--reset-every needs a --duration")
        schedule += periodic_resets(reset_every, parse_mode(mode), duration)
    return sorted(schedule, key=lambda r: r.at)


def lab(
    replicas: Annotated[int, typer.Option(min=1, help="Simulated replicas (one thread each).")] = 1,
    preset: Annotated[
        str | None,
        typer.Option(
            help="A named load model (workload and engine): "
            + ", ".join(f"{p.name} ({p.summary})" for p in PRESETS.values())
            + ". The flags below override its values; without a preset their defaults apply."
        ),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(min=0.001, help="Requests per simulated second. Default: 3.")
    ] = None,
    duration: Annotated[
        float, typer.Option(min=0.0, help="Simulated seconds to run; 0 = until ^C.")
    ] = 60.0,
    speed: Annotated[
        float,
        typer.Option(
            min=0.0, help="1 = real time, 10 = ten times faster, 0 = as fast as possible."
        ),
    ] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of prompts, arrivals and sampled tokens.")] = 7,
    num_blocks: Annotated[
        int | None, typer.Option(min=8, help="KV cache blocks per replica. Default: 400.")
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(min=1, help="Tokens per block. Default: 16.")
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="Max running requests. Default: 64.")
    ] = None,
    num_sys: Annotated[
        int | None,
        typer.Option(min=1, help="Shared system prompts (Zipf popularity). Default: 4."),
    ] = None,
    sys_prompt_len: Annotated[
        str | None, typer.Option(help="System prompt tokens LOW,HIGH. Default: 96,256.")
    ] = None,
    suffix_len: Annotated[
        str | None, typer.Option(help="Random suffix tokens LOW,HIGH. Default: 32,256.")
    ] = None,
    out_len: Annotated[
        str | None, typer.Option(help="Output tokens LOW,HIGH. Default: 16,64.")
    ] = None,
    step_time: Annotated[
        str | None,
        typer.Option(
            help="Simulated seconds a step takes: BASE,PER_TOKEN[,PER_REQUEST] for BASE + "
            "PER_TOKEN x scheduled tokens + PER_REQUEST x scheduled requests. "
            "Default: 0.025,6e-5,0."
        ),
    ] = None,
    resets: Annotated[
        str | None,
        typer.Option(help="Scheduled resets SECONDS:MODE,... e.g. 45:default,90:preempt,135:keep."),
    ] = None,
    reset_every: Annotated[
        float | None, typer.Option(min=0.001, help="Reset every this many simulated seconds.")
    ] = None,
    mode: Annotated[
        str, typer.Option(help="Mode of --reset-every: default, preempt or keep.")
    ] = ResetMode.DEFAULT.value,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Record each replica's stream (capture format; X.msgpack.gz plus X.json with "
            "ground truth). With several replicas: X-NAME.msgpack.gz."
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(help="KV event port of the first replica (+2 per replica); 0 = any.")
    ] = 0,
    replay_port: Annotated[
        int, typer.Option(help="Replay port of the first replica (+2 per replica); 0 = any.")
    ] = 0,
    http_port: Annotated[
        int, typer.Option(help="HTTP port of the first replica (+1 per replica); 0 = any.")
    ] = 0,
    http_host: Annotated[str, typer.Option(help="HTTP address to listen on.")] = "127.0.0.1",
    topic: Annotated[str, typer.Option(help="KV events topic.")] = "kv-events",
    snapshot_every: Annotated[
        float, typer.Option(min=0.0, help="Ground-truth snapshot period (sim s); 0 = none.")
    ] = 30.0,
    linger: Annotated[
        float,
        typer.Option(min=0.0, help="Wall seconds to stay up after the run (HTTP, replay)."),
    ] = 0.0,
    summary_json: Annotated[
        Path | None, typer.Option(help="Also write the summaries (every reset) as JSON here.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run simulated vLLM replicas: vLLM's real v1 Scheduler and KV event publisher, no model.

    Each replica serves vLLM-shaped HTTP (POST /reset_prefix_cache, GET /metrics,
    GET /kv_event_sources) on its own port; point `kvscope collect --replica NAME=HTTP_URL` at
    it. At the end: how often the server was idle (a default reset would have succeeded), and
    what every reset did, by mode.
    """
    say = err if as_json else console  # --json: stdout holds only the document
    try:
        workload, engine = build_load(
            preset,
            LoadFlags(
                rate=rate,
                seed=seed,
                num_blocks=num_blocks,
                block_size=block_size,
                max_num_seqs=max_num_seqs,
                num_sys=num_sys,
                sys_prompt_len=sys_prompt_len,
                suffix_len=suffix_len,
                out_len=out_len,
                step_time=step_time,
                topic=topic,
            ),
        )
        run_for = duration or None
        schedule = build_schedule(resets, reset_every, mode, run_for)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    # vLLM warns about what a CPU-only machine lacks (Triton, vllm._C) and about every failed
    # default reset; keep the lab's output to the lab unless asked otherwise.
    logging.getLogger("vllm").setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper())
    with say.status("loading vLLM's scheduler..."):
        from kvscope.lab.runner import LabOptions, run_lab

    options = LabOptions(
        replicas=replicas,
        workload=workload,
        engine=engine,
        duration=run_for,
        speed=speed,
        resets=schedule,
        record=record,
        port=port,
        replay_port=replay_port,
        http_port=http_port,
        http_host=http_host,
        snapshot_every=snapshot_every or None,
        preset=preset,
    )

    def ready(started: Sequence[LabReplica]) -> None:
        for r in started:
            say.print(
                f"[bold]{r.name}[/]: http {r.http_url}  events {r.connect_endpoint}  "
                f"replay {r.replay_connect_endpoint}  topic {engine.topic!r}"
            )
        how = "as fast as possible" if speed == 0 else f"at {speed:g}x real time"
        length = f"{run_for:g} simulated s" if run_for else "until ^C"
        say.print(
            f"running {len(started)} replica(s) {how} for {length}; {workload.rate:g} req/s each"
            + (f"; resets: {len(schedule)}" if schedule else "")
        )
        if started and started[0].http_url:
            say.print(
                f"  collect with: kvscope collect --replica {started[0].name}={started[0].http_url}"
            )

    try:
        with stop_on_signals() as stop:
            summaries = run_lab(options, stop=stop, on_ready=ready, linger=linger)
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc)) from exc
    print_report(console, summaries, as_json)
    if record is not None:
        from kvscope.lab.runner import record_path
        from kvscope.lab.sidecar import sidecar_path_for

        for s in summaries:
            path = record_path(record, s.name, replicas)
            say.print(f"recorded {path} and {sidecar_path_for(path)}")
    if summary_json is not None:
        summary_json.write_text(json.dumps([s.as_json() for s in summaries], indent=1) + "\n")
        say.print(f"wrote {summary_json}")


def print_report(out: Console, summaries: Sequence[ReplicaSummary], as_json: bool = False) -> None:
    tables = [replicas_table(summaries)]
    if any(s.resets for s in summaries):
        tables += [modes_table(summaries), resets_table(summaries)]
    if as_json:
        keys = ("replicas", "modes", "resets")
        document = {key: table.records for key, table in zip(keys, tables, strict=False)}
        out.file.write(json.dumps(document, default=str) + "\n")
        return
    for table in tables:
        show_table(out, table)
    if len(tables) == 1:
        out.print("no resets (give --resets or --reset-every)")


def register_lab(app: typer.Typer) -> None:
    """Add the `lab` command to `app` (the `kvscope` command)."""
    app.command(name="lab")(lab)
