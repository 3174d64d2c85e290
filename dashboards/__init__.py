"""Grafana dashboards as code: Fleet, Reset explorer and Collector health.

The dashboards are plain Python data: functions that return the dicts of Grafana's dashboard
JSON model (`model.py` only spells what every panel would repeat). No dashboard library
(grafanalib, grafonnet, the foundation SDK) is needed: it would be one more dependency, with its
own release cycle, to produce a JSON document whose shape Grafana itself keeps stable across
versions. That JSON is the interface: Grafana imports it, provisions it from files and diffs it;
the generated files are committed under `dashboards/json/` (regenerate them with
`python -m kvscope.dashboards.generate`; a test fails while they are stale), so they can be
reviewed in a diff and used without installing kvscope.

Data sources, both built into Grafana, chosen through dashboard variables (`prom`, `pg`):

- Prometheus, scraping kvscope's `/metrics` (the `kvscope_*` names of `collector/metrics.py`)
  and each vLLM replica's `/metrics`. vLLM labels its series only with `model_name` and
  `engine`, so its scrape job must add the replica's kvscope name as a `replica` label::

      scrape_configs:
        - job_name: kvscope
          static_configs: [{targets: ["kvscope-host:8087"]}]
        - job_name: vllm
          static_configs:
            - {targets: ["10.0.0.5:8000"], labels: {replica: a}}

- PostgreSQL: kvscope's store (`kvscope collect --store postgresql+psycopg://...`): resets,
  their recovery, requests, degraded intervals and per-second rollups. A SQLite store cannot
  be read by Grafana's built-in data sources.

`kvscope dashboards push --grafana-url URL --token TOKEN [--folder NAME]` creates or updates
them through Grafana's HTTP API (stable uids, overwrite); `kvscope dashboards export DIR`
writes the JSON files and a provisioning file for Grafana's file provider.
"""

from __future__ import annotations
