"""Reset explorer, the engine row: vLLM's own hit rate, TTFT and preemptions around the reset
(Prometheus)."""

from __future__ import annotations

from kvscope.dashboards.common import (
    RATE,
    kv,
    vllm,
)
from kvscope.dashboards.model import (
    Json,
    prom,
    row,
    timeseries,
)

REPLICA = 'replica="$reset_replica"'


def engine_panels() -> list[Json]:
    bucket = vllm("vllm:time_to_first_token_seconds_bucket")
    ttft = f"sum by (le) (rate({bucket}{{{REPLICA}}}[{RATE}]))"
    return [
        row("The engine around it (Prometheus; use the link above for the reset's time range)"),
        timeseries(
            "Prefix-cache hit rate",
            [
                prom(
                    f"sum(rate({vllm('vllm:prefix_cache_hits_total')}{{{REPLICA}}}[{RATE}])) / "
                    f"sum(rate({vllm('vllm:prefix_cache_queries_total')}{{{REPLICA}}}[{RATE}]))",
                    "$reset_replica hit rate",
                )
            ],
            unit="percentunit",
            min_value=0,
            max_value=1,
            w=12,
        ),
        timeseries(
            "Time to first token",
            [
                prom(f"histogram_quantile(0.5, {ttft})", "p50"),
                prom(f"histogram_quantile(0.99, {ttft})", "p99", "B"),
            ],
            description="From vLLM's time_to_first_token_seconds histogram.",
            unit="s",
            min_value=0,
            w=12,
        ),
        timeseries(
            "Preemptions and waiting requests",
            [
                prom(
                    f"sum(increase({vllm('vllm:num_preemptions_total')}{{{REPLICA}}}[{RATE}]))",
                    "preemptions",
                ),
                prom(f"sum({vllm('vllm:num_requests_waiting')}{{{REPLICA}}})", "waiting", "B"),
                prom(f"sum({vllm('vllm:num_requests_running')}{{{REPLICA}}})", "running", "C"),
            ],
            description="A reset that preempts running requests shows up here first.",
            unit="short",
            min_value=0,
            w=12,
        ),
        timeseries(
            "Blocks (kvscope)",
            [
                prom(
                    f"sum by (medium) ({kv('kvscope_cache_blocks')}{{{REPLICA}}})",
                    "{{medium}} stored",
                ),
                prom(
                    f"sum by (medium) ({kv('kvscope_cache_hittable_blocks')}{{{REPLICA}}})",
                    "{{medium}} hittable",
                    "B",
                ),
            ],
            unit="short",
            min_value=0,
            w=12,
        ),
    ]
