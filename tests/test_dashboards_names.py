"""Dashboard queries name real metrics, variables and dashboards; resets link as in the API."""

from __future__ import annotations

import re

from sqlalchemy import insert, text

from kvscope.collector.metrics import NAMES
from kvscope.dashboards.common import VLLM_METRICS, linked_request
from kvscope.storage import schema, scrape
from kvscope.storage.engine import open_store
from kvscope.storage.reset_links import LINK_WINDOW_S, clears_by_request
from tests.dashboards_support import DASHBOARDS, PROM_QUERIES, QUERIES, SQL_QUERIES
from tests.test_dashboards_schema import _PROMQL_WORDS


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in an expression: identifiers that are not functions, keywords, labels in
    matchers or grouping clauses, strings, or durations. A variable's label_values(selector,
    label) names the selector's metric."""
    variable = re.fullmatch(r"label_values\((.+),\s*\w+\)", expr.strip())
    if variable:
        expr = variable.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", expr):
        word = match.group(0).rstrip("( ")
        if match.group(1) or word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def test_every_promql_metric_name_is_kvscopes_or_vllms() -> None:
    assert set(scrape._FIELDS) | {scrape._TTFT_BUCKET} == VLLM_METRICS
    used: set[str] = set()
    for q in PROM_QUERIES:
        names = promql_metric_names(q.text)
        assert names, q.id
        assert names <= NAMES | VLLM_METRICS, (q.id, names - NAMES - VLLM_METRICS)
        used |= names
    assert promql_metric_names('sum by (a) (rate(x_total{b="c"}[5m])) / on (a) y') == {
        "x_total",
        "y",
    }
    # Every kvscope metric is on some dashboard.
    assert NAMES - used == set()


def test_panels_each_have_queries_of_one_known_source() -> None:
    for d in DASHBOARDS:
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            assert p["targets"], p["title"]
            assert {t["datasource"]["type"] for t in p["targets"]} == {p["datasource"]["type"]}
    assert len(PROM_QUERIES) + len(SQL_QUERIES) == len(QUERIES)


def test_links_name_real_variables_and_dashboards() -> None:
    uids = {d["uid"] for d in DASHBOARDS}
    variables = {d["uid"]: {v["name"] for v in d["templating"]["list"]} for d in DASHBOARDS}
    urls = [
        link["url"]
        for d in DASHBOARDS
        for link in [*d["links"]]
        + [
            x
            for p in d["panels"]
            for x in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
        ]
        if link.get("url")
    ]
    assert urls
    for url in urls:
        uid = re.match(r"^/d/([^/]+)/", url)
        assert uid and uid.group(1) in uids, url
        for name in re.findall(r"var-(\w+)=", url):
            assert name in variables[uid.group(1)], url
        for name in re.findall(r"\$\{(\w+)(?::\w+)?\}", url):
            assert name in set().union(*variables.values()), url


# --- which request a reset followed: the API's rule, in SQL ------------------------------------
def test_the_dashboards_link_resets_to_requests_as_the_api_does(store_url: str) -> None:
    """The dashboards' join (`linked_request`) picks, for every clear, the request that
    `storage/reset_links.py` (GET /resets, the demo, the report) picks, here where the engine's
    clock (`ts`) and the collector's (`recv_ts`) disagree, as a lab's simulated clock does."""
    t, window = 1_800_000_000.0, LINK_WINDOW_S
    engine = open_store(store_url)
    with engine.begin() as conn:
        lab, other = (
            conn.execute(
                insert(schema.streams).values(replica=n, rank=0).returning(schema.streams.c.id)
            ).scalar_one()
            for n in ("lab", "other")
        )
        for replica, at, outcome in [
            ("lab", t, "success"),  # 1
            ("lab", t + 1000, "success"),  # 2
            ("lab", t + 1000, "success"),  # 3: at the same instant as 2, recorded after it
            ("lab", t + 1005, "refused"),  # 4: made no clear
            ("lab", t + 3000, "success"),  # 5
            ("other", t + 5000, "success"),  # 6
        ]:
            conn.execute(
                insert(schema.reset_requests).values(
                    replica=replica,
                    requested_at=at,
                    requested_by="t",
                    mode="keep",
                    external=False,
                    outcome=outcome,
                    http_status=200,
                    detail="",
                )
            )
        for stream, seq, ts, recv_ts, reason in [
            (lab, 1, t + 1, t + window + 400, "all_blocks_cleared"),  # arrived too late
            (lab, 2, t + 9999, t + 1010, "all_blocks_cleared"),  # engine clock far ahead
            (lab, 3, t + 1000 + window, None, "all_blocks_cleared"),  # by ts, at the window's end
            (lab, 4, t + 3001, t + 3002, "restart"),  # not what a request made
            (lab, 5, t + 3010, t + 2999, "all_blocks_cleared"),  # arrived before request 5
            (other, 6, t + 5001, t + 5001, "all_blocks_cleared"),
            (lab, 7, t + 5001, t + 5001, "all_blocks_cleared"),  # request 6 is other's
        ]:
            conn.execute(
                insert(schema.resets).values(
                    stream_id=stream,
                    epoch=0,
                    seq=seq,
                    ts=ts,
                    recv_ts=recv_ts,
                    reason=reason,
                    degraded=False,
                    before_blocks=1,
                    before_hittable=1,
                    before_orphans=0,
                    before_tokens=16,
                    before=b"",
                )
            )
    with engine.connect() as conn:
        join = f"FROM resets r JOIN streams s ON s.id = r.stream_id{linked_request()}"
        query = f"SELECT r.id, q.id {join}"
        dashboards = {c: q for c, q in conn.execute(text(query))}
        api = {c: q for q, cs in clears_by_request(conn, window).items() for c in cs}
    engine.dispose()
    expected = {1: None, 2: 3, 3: 3, 4: None, 5: None, 6: 6, 7: None}
    assert dashboards == {c: api.get(c) for c in dashboards} == expected


def test_the_dashboards_read_requests_only_through_the_link() -> None:
    """No panel repeats the rule in its own words: a query reads `reset_requests` through
    `linked_request`, or lists the requests themselves (the requests annotation)."""
    link = " ".join(linked_request().split())
    for query in SQL_QUERIES:
        words = " ".join(query.text.split())
        if (
            "reset_requests" in words
            and "FROM reset_requests q WHERE $__unixEpochFilter" not in words
        ):
            assert link in words, query.id
