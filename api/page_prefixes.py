"""The page's picture of a reset's prefix groups (`GET resets/{id}/prefixes`), before vs after.

One row of rectangles, one per group, as wide as its tokens before the reset and coloured by
its status (when it was back); under it, each group's share of blocks hittable again at the
last offset reached. A legend gives the tokens per status, each rectangle a <title> tooltip.
Its script joins the page's (api/page.py: the helpers `el`, `svg`, `int`, `getJson` and
`selected` are that script's); data goes into the DOM as text nodes only.
"""

from __future__ import annotations

PREFIXES_SCRIPT = """
const STATUS_COLORS = { "back at +1 s": "#1b9e5a", "back at +10 s": "#8cc43f",
  "back at +60 s": "#f2b134", "back later": "#e07b00", "not back": "#c62828" };
const PREFIX_PAGE = 500;

async function loadPrefixes(id) {
  let p;
  try {
    p = await getJson(`resets/${encodeURIComponent(id)}/prefixes?limit=${PREFIX_PAGE}`);
  } catch (error) {
    if (selected === id) {
      $("prefixes").replaceChildren(el("p", { class: "empty" }, "prefixes: " + error.message));
    }
    return;
  }
  if (selected === id && $("prefixes")) $("prefixes").replaceChildren(...prefixView(p));
}

function prefixView(p) {
  if (!p.items.length) return [el("p", { class: "empty" }, "The cache was empty before it.")];
  const W = 720, L = 64, R = 8, rowH = 28, gap = 10, T = 4;
  const last = p.offsets_reached.length ? p.offsets_reached[p.offsets_reached.length - 1] : null;
  const H = T + 2 * rowH + gap + 20;
  const root = svg("svg", { id: "prefix-chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`,
    role: "img", "aria-label": `Reset ${p.reset_id}: the prefix groups before it, width by `
      + "tokens, coloured by when they were back, and the share hittable again after it" });
  root.append(svg("title", {}, `Reset #${p.reset_id}: prefix groups before vs after`));
  const shown = p.items.reduce((n, g) => n + g.tokens, 0);
  const scale = (W - L - R) / Math.max(1, shown);
  const yAfter = T + rowH + gap;
  root.append(svg("text", { x: L - 6, y: T + rowH / 2 + 4, "text-anchor": "end" }, "before"));
  root.append(svg("text", { x: L - 6, y: yAfter + rowH / 2 + 4, "text-anchor": "end" },
    last === null ? "after" : `+${last} s`));
  let x = L;
  for (const g of p.items) {
    const w = g.tokens * scale;
    const at = g.points.length ? g.points[g.points.length - 1] : null;
    const tip = `root ${g.root_text} (${g.medium}/${g.group}): ${int(g.blocks)} blocks, `
      + `${int(g.tokens)} tokens, ${int(g.shared_blocks)} shared; ${g.status}`
      + (at ? `; at +${at.offset_s} s ${int(at.blocks_back)} cached, `
        + `${int(at.hittable_back)} hittable again` : "")
      + (g.first_text !== null ? `; first tokens: ${g.first_text}`
        : g.first_tokens ? `; first tokens ${g.first_tokens.join(" ")}` : "");
    const box = svg("rect", { class: "group", "data-status": g.status, x: x.toFixed(2), y: T,
      width: w.toFixed(2), height: rowH, fill: STATUS_COLORS[g.status] || "#9aa5b1",
      stroke: "#fff", "stroke-width": 1 });
    box.append(svg("title", {}, tip));
    root.append(box);
    root.append(svg("rect", { class: "slot", x: x.toFixed(2), y: yAfter, width: w.toFixed(2),
      height: rowH, fill: "#eef1f4", stroke: "#fff", "stroke-width": 1 }));
    const share = at && g.blocks ? at.hittable_back / g.blocks : 0;
    const back = svg("rect", { class: "back", x: x.toFixed(2), y: yAfter,
      width: (w * share).toFixed(2), height: rowH, fill: STATUS_COLORS[g.status] || "#9aa5b1" });
    back.append(svg("title", {}, tip));
    root.append(back);
    x += w;
  }
  root.append(svg("text", { x: W - R, y: H - 4, "text-anchor": "end" },
    "width: tokens before the reset; below: the share of each group's blocks hittable again"));
  const legend = el("div", { class: "legend", id: "prefix-legend" },
    ...Object.entries(STATUS_COLORS).map(([status, color]) => el("span",
      { "data-status": status }, el("i", { "data-color": color }),
      `${status}: ${int(p.tokens_by_status[status] || 0)} tokens`)));
  for (const swatch of legend.querySelectorAll("i")) {
    swatch.style.background = swatch.dataset.color;
    swatch.style.height = "10px";
  }
  const notes = [el("p", { class: "empty", id: "prefix-summary" },
    `${int(p.groups_total)} groups, ${int(p.tokens_total)} tokens before; back: the first `
    + `offset with ${Math.round(100 * p.back_share)} % of a group's shared blocks hittable again`
    + (p.recovery_complete ? "" : " (partial: as of the offsets reached)")
    + (p.next_cursor ? `; the largest ${p.items.length} shown` : ""))];
  if (p.unknown_because.length) {
    notes.push(el("p", { class: "empty", id: "prefix-unknown" },
      "The map after the clear may be incomplete: " + p.unknown_because.join("; ")));
  }
  if (p.orphans_total) {
    const rejoined = p.orphans.filter((o) => o.rejoined_ts !== null).length;
    const removed = p.orphans.filter((o) => o.removed_ts !== null).length;
    notes.push(el("p", { id: "prefix-orphans" }, `Orphans the reset left: ${int(p.orphans_total)}`
      + ` (${int(rejoined)} rejoined their chain, ${int(removed)} removed first, `
      + `${int(p.orphans.length - rejoined - removed)} still orphaned by +${last} s)`));
  }
  if (p.evicted_orphans_total) {
    const rejoined = p.evicted_orphans.filter((o) => o.rejoined_ts !== null).length;
    notes.push(el("p", { class: "empty", id: "prefix-evicted" }, "Not the reset's: "
      + `${int(p.evicted_orphans_total)} blocks orphaned later, their parent evicted first `
      + `(${int(rejoined)} rejoined)`));
  }
  return [el("figure", { id: "prefix-groups" }, root, legend), ...notes];
}

"""
