"""What a fuzz run must find through the API once everything sent has been read."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from kvscope.fuzz.plan import HONEST, HOSTILE, Interleaving, MapRows, api_rows, honest_oracle
from kvscope.fuzz.plan import map_rows as oracle_rows

if TYPE_CHECKING:
    from kvscope.fuzz.live import FuzzResult

Get = Callable[[str], httpx.Response]
_MALFORMED = re.compile(r"^kvscope_ingest_malformed_total\{([^}]*)\}\s+(\S+)$", re.MULTILINE)
_QUEUE = re.compile(r"^kvscope_store_queue_rows\s+(\S+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
CRASH_MARKS = ("Traceback (most recent call last)", "Exception in thread")


def malformed_counts(metrics_text: str) -> dict[str, dict[str, int]]:
    """`kvscope_ingest_malformed_total` by replica and kind."""
    counts: dict[str, dict[str, int]] = {}
    for labels, value in _MALFORMED.findall(metrics_text):
        named = dict(_LABEL.findall(labels))
        if float(value):
            counts.setdefault(named["replica"], {})[named["kind"]] = int(float(value))
    return counts


def store_queue_rows(metrics_text: str) -> float:
    queue = _QUEUE.search(metrics_text)
    return float(queue.group(1)) if queue else 0.0


def blocks(get: Get, replica: str) -> MapRows:
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = get(f"/replicas/{replica}/blocks?limit=10000{cursor}").json()
        items += page["items"]
        if page["next_cursor"] is None:
            return api_rows(items)
        cursor = f"&cursor={page['next_cursor']}"


def unsigned(rows: MapRows) -> MapRows:
    """Rows with int hashes in vLLM's unsigned form: a map that once saw a negative hash shows
    every hash signed from then on (`MapCounters.signed_hashes` is kept across clears)."""

    def u(h: Any) -> Any:
        return h + 2**64 if type(h) is int and h < 0 else h

    return sorted(((u(r[0]), *r[1:4], u(r[4]), *r[5:]) for r in rows), key=repr)


def _differ(a: MapRows, b: MapRows) -> str:
    only_a, only_b = set(a) - set(b), set(b) - set(a)
    first = sorted(only_a | only_b, key=repr)[:3]
    return (
        f"{len(a)} vs {len(b)} rows, {len(only_a)} only live, {len(only_b)} only expected; {first}"
    )


def live_state(
    get: Get, plan: Interleaving, result: FuzzResult, resubscribed: dict[str, int]
) -> None:
    fail = result.failures.append
    if get("/readyz").status_code != 200:
        fail(f"/readyz answers {get('/readyz').status_code}")
    for name, again in resubscribed.items():
        if again:
            fail(f"{name}: the collector subscribed {again} more times (reconnected: frames lost)")
    tally = plan.tally
    honest, hostile = get(f"/replicas/{HONEST}").json(), get(f"/replicas/{HOSTILE}").json()
    h, x = honest["ranks"][0], hostile["ranks"][0]
    for rank, last in ((h, tally.honest_last_seq), (x, plan.oracle.last_seq)):
        if rank["last_seq"] != last or not rank["connected"]:
            fail(
                f"a stream at seq {rank['last_seq']} (expected {last}), "
                f"connected {rank['connected']}"
            )
    if h["degraded"] is not None:
        fail(f"honest is degraded: {h['degraded']}")
    truth = oracle_rows(honest_oracle(plan.records).map)
    live_honest, live_hostile = blocks(get, HONEST), blocks(get, HOSTILE)
    if live_honest != truth:
        fail(f"the honest map differs from the capture's alone: {_differ(live_honest, truth)}")
    oracle = plan.oracle
    expected = oracle_rows(oracle.map)
    if live_hostile != expected:
        fail(f"the hostile map differs from the oracle's: {_differ(live_hostile, expected)}")
    if (x["degraded"] is None) != (oracle.degraded is None):
        fail(f"hostile degraded {x['degraded']}, the oracle says {oracle.degraded}")
    result.hostile_degraded = None if x["degraded"] is None else x["degraded"]["reason"]
    truth, live_hostile = unsigned(truth), unsigned(live_hostile)
    if plan.clean_end:
        if x["degraded"] is not None:
            fail(
                f"every taint came before the last clear, yet hostile is degraded: {x['degraded']}"
            )
        if live_hostile != truth:
            fail(
                f"the hostile map differs from the capture's alone: {_differ(live_hostile, truth)}"
            )
    elif x["degraded"] is None and live_hostile != truth:
        if tally.accepted_after_last_clear:
            result.notes.append(
                f"hostile differs from the capture and is not degraded: "
                f"{tally.accepted_after_last_clear} hostile batches after the last clear decoded "
                "as valid ones (a publisher's word; no collector can tell)"
            )
        else:
            fail("hostile differs from the capture's map and is not marked degraded")
    metrics = get("/metrics").text
    result.malformed = malformed_counts(metrics)
    result.store_queue_rows = store_queue_rows(metrics)
    result.expected_malformed = dict(oracle.counters.malformed)
    if result.malformed.get(HOSTILE, {}) != result.expected_malformed:
        live = result.malformed.get(HOSTILE)
        fail(f"malformed by kind {live}, the oracle's {result.expected_malformed}")
    if result.malformed.get(HONEST):
        fail(f"honest frames counted malformed: {result.malformed[HONEST]}")


def after_stop(log_path: Path, result: FuzzResult) -> None:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    for mark in CRASH_MARKS:
        at = text.find(mark)
        if at >= 0:
            result.failures.append(f"serve logged {mark!r}:\n{text[max(0, at - 200) : at + 3000]}")
            break
    if result.exit_code != 0:
        result.failures.append(f"serve did not stop cleanly on SIGTERM: exit {result.exit_code}")


def summary(result: FuzzResult) -> str:
    t = result.tally
    lines = [
        f"hostile messages: {t.sent.total()} ({t.hostile_bytes / 2**20:.1f} MiB), "
        f"honest batches: {t.honest_messages} on each replica"
    ]
    lines += [f"  {cls:<14} {n:>8}" for cls, n in sorted(t.sent.items())]
    live = result.malformed.get(HOSTILE, {})
    lines.append(f"malformed counted (hostile): {sum(live.values())}")
    lines += [f"  {kind:<22} {n:>8}" for kind, n in sorted(live.items())]
    before, after, peak = result.rss_kib
    lines.append(
        f"serve RSS: {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after "
        f"(+{(after - before) / 1024:.1f}), peak {peak / 1024:.1f} MiB"
    )
    lines.append(f"store writer queue at the end: {result.store_queue_rows:.0f} rows")
    if result.drained is not None:
        waited, rss = result.drained
        lines.append(f"  emptied {waited:.1f} s later; serve RSS then {rss / 1024:.1f} MiB")
    end = f"degraded ({result.hostile_degraded})" if result.hostile_degraded else "known"
    lines.append(
        f"hostile at the end: {end}; every taint before the last clear: {result.clean_end}"
    )
    lines.append(f"wall time: {result.wall_s:.1f} s; serve exit: {result.exit_code}")
    lines += [f"note: {n}" for n in result.notes]
    lines += [f"FAILED: {f}" for f in result.failures] or ["result: PASS"]
    return "\n".join(lines)
