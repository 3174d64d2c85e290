"""benchmarks/fleet.py runs end to end in its smallest form: two publishers in connect mode
into one collector, with the store off, on a SQLite file and on a fresh PostgreSQL database.

Only that it runs and prints its figures: the figures themselves depend on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "fleet.py"
FIGURES = {
    "replicas",
    "lag_p50_s",
    "lag_p99_s",
    "unapplied",
    "store_dropped",
    "degraded",
    "drain_s",
    "cpu_cores",
    "store_bytes_per_replica_hour",
}


def test_fleet_benchmark_runs_and_prints_its_figures(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--replicas", "2", "--duration", "1", "--warmup", "0.5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("lag p99" in line and "replicas/core" in line for line in lines), done.stdout
    summary = json.loads(lines[-1])
    assert set(summary) == {"none", "sqlite", "postgresql"}
    for store in summary.values():
        (trial,) = store["trials"]
        assert trial["replicas"] == 2
        assert set(trial) >= FIGURES
    assert list(tmp_path.iterdir()) == [], "the benchmark wrote nothing where it ran"
