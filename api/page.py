"""GET /: one self-contained page over the API: replicas, resets, and one reset's recovery.

Plain HTML, CSS and a little vanilla JavaScript in this module: no build step, no files to
package, nothing fetched from elsewhere. The script reads the API next to it (relative URLs, so
the page works behind a path prefix too): `GET replicas` every 2 s, `GET resets` every 15 s,
and `GET resets/{id}` for the reset shown (the newest by default, or `#reset=ID`), whose
recovery it draws as an inline SVG chart, with `GET resets/{id}/prefixes`: its prefix groups
before vs after, one rectangle per group, as wide as its tokens, coloured by when it was back
(api/page_prefixes.py), and `GET resets/compare` for that reset's replica: its reset modes side
by side (api/page_modes.py). Data goes into the DOM as text nodes only, and a
Content-Security-Policy allows nothing but this page's own script and style (by hash) and
requests to its own origin.
"""

from __future__ import annotations

import base64
import hashlib

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from kvscope.api.page_modes import MODES_SCRIPT, MODES_SECTION
from kvscope.api.page_prefixes import PREFIXES_SCRIPT
from kvscope.api.page_recovery import RECOVERY_SCRIPT

page_router = APIRouter(tags=["page"])

STYLE = """
:root { color-scheme: light; --fg: #1d232b; --muted: #5b6673; --line: #d9dee4; --bg: #f6f7f9;
  --blocks: #2f6fd6; --hittable: #1b9e5a; --orphans: #e07b00; --bad: #c62828; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px;
  background: #fff; border-bottom: 1px solid var(--line); }
header h1 { font-size: 18px; margin: 0; }
#status { color: var(--muted); font-size: 12px; }
#status.error { color: var(--bad); }
main { padding: 16px 20px; display: grid; gap: 16px; grid-template-columns: minmax(0, 1fr); }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 16px; }
h2 { font-size: 15px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
  white-space: nowrap; }
thead th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.selected { background: #eef4ff; }
button.link { border: 0; background: none; color: var(--blocks); cursor: pointer; padding: 0;
  font: inherit; text-decoration: underline; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px;
  background: #e8ecf0; }
.badge.live { background: #dff3e7; color: #146c3e; }
.badge.degraded, .badge.disconnected { background: #fde2e1; color: var(--bad); }
.badge.silent, .badge.stored { background: #fff1d6; color: #8a5a00; }
.empty { color: var(--muted); }
.detail { display: grid; gap: 12px; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
dt { color: var(--muted); }
dd { margin: 0; }
svg text { font-size: 11px; fill: var(--muted); }
.legend span { margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 14px; height: 3px; margin-right: 4px;
  vertical-align: middle; }
"""

SCRIPT = """
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const COLORS = { blocks: "#2f6fd6", hittable: "#1b9e5a", orphans: "#e07b00" };
let selected = null;
let resetsCache = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}
const int = (n) => (n === null || n === undefined ? "\\u2013" : Number(n).toLocaleString("en-US"));
const secs = (s) => (s === null || s === undefined ? "\\u2013"
  : (s < 10 ? s.toFixed(1) : String(Math.round(s))) + " s");
const pct = (x) => (x === null || x === undefined ? "\\u2013" : (100 * x).toFixed(1) + " %");
const ago = (s) => (s === null || s === undefined ? "\\u2013" : s < 120 ? secs(s)
  : s < 7200 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h");
const offset = (s) => (Math.abs(s) < 1 ? "in step"
  : ago(Math.abs(s)) + (s > 0 ? " behind" : " ahead"));
const when = (ts) => (ts === null || ts === undefined ? "\\u2013"
  : new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC");

function setStatus(message, isError) {
  const status = $("status");
  status.textContent = message;
  status.className = isError ? "error" : "";
}

async function getJson(path) {
  const response = await fetch(path, { headers: { accept: "application/json" } });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error(body && body.error ? body.error.message
      : response.status + " " + response.statusText);
    error.code = body && body.error ? body.error.code : null;
    throw error;
  }
  return body;
}

function rankState(rank) {
  if (rank.degraded) return "degraded";
  if (rank.source === "store") return "stored";
  if (!rank.connected) return "disconnected";
  return rank.silent ? "silent" : "live";
}

function renderReplicas(replicas) {
  const rows = [];
  for (const replica of replicas) {
    for (const rank of replica.ranks) {
      const state = rankState(rank);
      const tiers = rank.tables.map((t) => `${t.medium}/${t.group}: ${int(t.blocks)}`
        + ` (${int(t.hittable)} hittable)`).join(", ");
      const fresh = (rank.source === "live" ? "last batch " : "stored ") + ago(rank.age_s)
        + " ago" + (rank.engine_clock_offset_s === null ? ""
          : "; engine clock " + offset(rank.engine_clock_offset_s));
      rows.push(el("tr", { "data-replica": replica.replica, "data-rank": rank.rank },
        el("th", { scope: "row" }, replica.replica), el("td", { class: "num" }, rank.rank),
        el("td", {}, el("span", { class: "badge " + state }, state)),
        el("td", { class: "num" }, rank.epoch), el("td", { class: "num" }, int(rank.last_seq)),
        el("td", { class: "num", "data-field": "blocks" }, int(rank.blocks)),
        el("td", { class: "num", "data-field": "hittable" }, int(rank.hittable)),
        el("td", { class: "num", "data-field": "orphans" }, int(rank.orphans)),
        el("td", {}, tiers || "\\u2013"), el("td", {}, fresh)));
    }
  }
  if (!rows.length) {
    rows.push(el("tr", {}, el("td", { colspan: 10, class: "empty" }, "No replica yet.")));
  }
  $("replicas-body").replaceChildren(...rows);
}

function renderResets(resets) {
  const rows = resets.slice().reverse().map((r) => el("tr",
    { "data-reset-id": r.id, class: r.id === selected ? "selected" : "" },
    el("td", {}, el("button", { class: "link", type: "button", onclick: () => select(r.id) },
      "#" + r.id)),
    el("td", {}, when(r.ts)), el("td", {}, `${r.replica}/${r.rank}`), el("td", {}, r.reason),
    el("td", {}, r.mode || "\\u2013"),
    el("td", {}, r.request ? r.request.outcome : "\\u2013"),
    el("td", { class: "num" }, int(r.before_blocks)),
    el("td", { class: "num" }, int(r.before_hittable)),
    el("td", { class: "num" }, secs(r.t50_s)), el("td", { class: "num" }, secs(r.t90_s))));
  if (!rows.length) {
    rows.push(el("tr", {}, el("td", { colspan: 10, class: "empty" }, "No reset recorded yet.")));
  }
  $("resets-body").replaceChildren(...rows);
}

function hashReset() {
  const found = /reset=(\\d+)/.exec(location.hash);
  return found ? Number(found[1]) : null;
}

function select(id) {
  selected = id;
  if (hashReset() !== id) history.replaceState(null, "", "#reset=" + id);
  for (const row of document.querySelectorAll("#resets-body tr[data-reset-id]")) {
    row.className = Number(row.dataset.resetId) === id ? "selected" : "";
  }
  loadReset(id);
}

async function loadReset(id) {
  try {
    const detail = await getJson("resets/" + encodeURIComponent(id));
    if (selected === id) renderReset(detail);
  } catch (error) {
    $("reset-title").textContent = "Reset #" + id;
    $("reset-body").replaceChildren(el("p", { class: "empty" }, error.message));
  }
}

function table(head, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...head.map((h, i) => el("th", i ? { class: "num" } : {}, h)))),
    el("tbody", {}, ...rows.map((row) => el("tr", {}, ...row.map((cell, i) =>
      el(i ? "td" : "th", i ? { class: "num" } : { scope: "row" }, cell))))));
}

function renderReset(d) {
  $("reset-title").textContent = `Reset #${d.id} on ${d.replica}/${d.rank}`;
  const request = d.request ? `${d.request.mode}, ${d.request.outcome} (${d.request.requested_by})`
    : "none through kvscope";
  const facts = [["When", when(d.ts)], ["Why", d.reason], ["Mode", d.mode || "\\u2013"],
    ["Request", request], ["Map degraded", d.degraded ? "yes" : "no"],
    ["Before", `${int(d.before_blocks)} blocks, ${int(d.before_hittable)} hittable, `
      + `${int(d.before_orphans)} orphans, ${int(d.before_tokens)} tokens`],
    ["50 % back", secs(d.t50_s)], ["90 % back", secs(d.t90_s)],
    ["Peak orphans", int(d.peak_orphans)]];
  const summary = el("dl", { id: "reset-facts" },
    ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const tiers = table(["Tier before", "Blocks", "Hittable", "Orphans"],
    d.before_tables.map((t) => [`${t.medium} group ${t.group}`, int(t.blocks), int(t.hittable),
      int(t.orphans)]));
  const last = d.recovery.length ? d.recovery[d.recovery.length - 1] : null;
  const afterRows = [["before", int(d.before_blocks), int(d.before_hittable),
    int(d.before_orphans), "100 %", "100 %"]];
  for (const p of d.recovery) {
    afterRows.push(["+" + p.offset_s + " s", int(p.blocks), int(p.hittable), int(p.orphans),
      pct(p.share_blocks_back), pct(p.share_tokens_back)]);
  }
  const after = table(["Whole map", "Blocks", "Hittable", "Orphans", "Blocks back",
    "Tokens back"], afterRows);
  after.id = "before-after";
  const left = el("div", {}, summary, el("h3", {}, "Before, per tier"), tiers);
  const right = el("div", {}, el("h3", {}, last ? `Before vs after (last: +${last.offset_s} s)`
    : "Before vs after"), after);
  const chart = d.recovery.length ? recoveryChart(d)
    : el("p", { class: "empty", id: "recovery-chart" },
      "No recovery point reached yet: each is stored as the stream passes its offset.");
  const reached = d.offsets_reached.length ? d.offsets_reached[d.offsets_reached.length - 1]
    : null;
  // Partial: still being followed, or cut short by a later reset or the stream's end.
  const partial = d.recovery_complete ? [] : [el("p", { class: "empty", id: "recovery-partial" },
    reached === null ? "partial: no offset reached yet"
      : `partial: offsets up to +${reached} s reached, last batch at `
        + when(d.recovery_until_ts))];
  $("reset-body").replaceChildren(el("div", { class: "detail" }, left, right),
    el("h3", {}, "Recovery"), ...partial, chart,
    el("h3", {}, "What came back, prefix by prefix"),
    el("div", { id: "prefixes" }, el("p", { class: "empty" }, "Loading prefixes\u2026")));
  loadPrefixes(d.id);
  loadModes(d.replica);
}

async function refreshReplicas() {
  try {
    renderReplicas(await getJson("replicas"));
    setStatus("Updated " + new Date().toLocaleTimeString("en-GB"), false);
  } catch (error) {
    setStatus("replicas: " + error.message, true);
  }
}

async function refreshResets() {
  try {
    resetsCache = await getJson("resets");
    renderResets(resetsCache);
    if (modesReplica !== null) loadModes(modesReplica);
    const wanted = hashReset();
    if (selected === null && resetsCache.length) {
      const known = resetsCache.some((r) => r.id === wanted);
      select(known ? wanted : resetsCache[resetsCache.length - 1].id);
    }
  } catch (error) {
    const text = error.code === "no_store"
      ? "This API keeps no store, so no reset is recorded." : "resets: " + error.message;
    $("resets-body").replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "empty" },
      text)));
  }
}

window.addEventListener("hashchange", () => {
  const id = hashReset();
  if (id !== null && id !== selected) select(id);
});
refreshReplicas();
refreshResets();
setInterval(refreshReplicas, 2000);
setInterval(refreshResets, 15000);
"""
SCRIPT += RECOVERY_SCRIPT + PREFIXES_SCRIPT + MODES_SCRIPT

BODY = """
<header><h1>kvscope</h1><span>vLLM prefix caches, their resets and recoveries</span>
<span id="status" role="status" aria-live="polite">Loading\u2026</span></header>
<main>
<section aria-labelledby="replicas-title">
<h2 id="replicas-title">Replicas</h2>
<table id="replicas"><thead><tr><th>Replica</th><th class="num">Rank</th><th>State</th>
<th class="num">Epoch</th><th class="num">Last seq</th><th class="num">Blocks</th>
<th class="num">Hittable</th><th class="num">Orphans</th><th>Tiers</th><th>Fresh</th></tr></thead>
<tbody id="replicas-body"></tbody></table>
</section>
<section aria-labelledby="resets-title">
<h2 id="resets-title">Resets</h2>
<table id="resets"><thead><tr><th>Reset</th><th>When</th><th>Replica</th><th>Why</th>
<th>Mode</th><th>Request</th><th class="num">Blocks before</th><th class="num">Hittable before</th>
<th class="num">50 % back</th><th class="num">90 % back</th></tr></thead>
<tbody id="resets-body"></tbody></table>
</section>
"""
BODY += MODES_SECTION
BODY += """
<section id="reset-detail" aria-labelledby="reset-title">
<h2 id="reset-title">Reset</h2>
<div id="reset-body"><p class="empty">Pick a reset above.</p></div>
</section>
</main>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = (
    '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    f"<title>kvscope</title>\n<style>{STYLE}</style>\n</head>\n<body>{BODY}"
    f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
)
CSP = (
    f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@page_router.get("/", include_in_schema=False, response_class=HTMLResponse)
def page() -> HTMLResponse:
    """The page: replicas (live counts), resets, one reset's before/after and recovery chart."""
    return HTMLResponse(
        PAGE,
        headers={
            "content-security-policy": CSP,
            "cache-control": "no-cache",
            "x-content-type-options": "nosniff",
        },
    )
