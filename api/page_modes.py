"""The page's modes side by side (`GET resets/compare`): for the replica of the reset shown,
one column per reset mode and one row per figure, each cell the median over that mode's resets
that cleared (refused: refused/resets), as storage/mode_compare.py computes them. Each cell
keeps the API's value in `data-value`, so what is shown can be checked against the API. Its
script joins the page's (api/page.py: `el`, `int`, `secs`, `pct` and `getJson` are that
script's); data goes into the DOM as text nodes only.
"""

from __future__ import annotations

MODES_SECTION = """
<section id="modes" aria-labelledby="modes-title">
<h2 id="modes-title">Modes side by side</h2>
<div id="modes-body"><p class="empty">Pick a reset: its replica's modes are compared here.</p>
</div>
</section>
"""

MODES_SCRIPT = """
const ms = (s) => (s === null || s === undefined ? "\\u2013" : Math.round(1000 * s) + " ms");
const MODE_ROWS = [["preempted", "requests preempted", int],
  ["tokens_recomputed", "tokens recomputed", int], ["t50_s", "50 % back", secs],
  ["t90_s", "90 % back", secs], ["share_back_10s", "prefixes back at +10 s", pct],
  ["orphans", "orphans left", int], ["hit_rate_before", "hit rate before", pct],
  ["hit_rate_after", "hit rate after", pct], ["ttft_p50_before", "TTFT p50 before", ms],
  ["ttft_p50_after", "TTFT p50 after", ms]];
let modesReplica = null;

async function loadModes(replica) {
  modesReplica = replica;
  let c;
  try {
    c = await getJson(`resets/compare?replica=${encodeURIComponent(replica)}`);
  } catch (error) {
    if (modesReplica === replica) {
      $("modes-body").replaceChildren(el("p", { class: "empty" }, "modes: " + error.message));
    }
    return;
  }
  if (modesReplica === replica) $("modes-body").replaceChildren(...modesView(c));
}

function modeCell(mode, key, value, text) {
  return el("td", { class: "num", "data-mode": mode, "data-value": value === null ? "null"
    : String(value) }, text);
}

function modesView(c) {
  $("modes-title").textContent = `Modes side by side on ${c.replica}`;
  if (!c.modes.length) return [el("p", { class: "empty" }, `No reset of ${c.replica} yet.`)];
  const head = el("tr", {}, el("th", {}, "Median over the mode's resets"),
    ...c.modes.map((m) => el("th", { class: "num", "data-mode": m.mode }, m.mode)));
  const refused = el("tr", { "data-figure": "refused" }, el("th", { scope: "row" }, "refused"),
    ...c.modes.map((m) => modeCell(m.mode, "refused", m.refused, `${m.refused}/${m.resets}`)));
  const rows = MODE_ROWS.map(([key, label, show]) => el("tr", { "data-figure": key },
    el("th", { scope: "row" }, label),
    ...c.modes.map((m) => modeCell(m.mode, key, m.medians[key], show(m.medians[key])))));
  const made = c.resets.filter((r) => !r.refused).length;
  return [el("table", { id: "modes-table" }, el("thead", {}, head),
    el("tbody", {}, refused, ...rows)),
    el("p", { class: "empty", id: "modes-note" }, `${int(c.resets.length)} reset requests or `
      + `clears, ${int(made)} of them cleared; hit rate and TTFT over 30 s before and after `
      + "each clear; \\u2013: unknown (not scraped, or no reset of that mode cleared)")];
}
"""
