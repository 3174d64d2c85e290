"""The page's recovery chart of one reset (`GET resets/{id}`'s points): blocks, hittable and
orphans against seconds since the reset on a log scale, with the before level, 50 % / 90 % lines
and t50 / t90 markers. Its script joins the page's (api/page.py: `el`, `svg`, `int`, `secs` and
`COLORS` are that script's).
"""

from __future__ import annotations

RECOVERY_SCRIPT = """
function recoveryChart(d) {
  const W = 720, H = 280, L = 56, R = 16, T = 16, B = 40;
  const points = d.recovery;
  const xMax = Math.max(300, ...points.map((p) => p.offset_s));
  const yMax = Math.max(1, d.before_blocks, ...points.map((p) => p.blocks)) * 1.1;
  const x = (s) => L + (W - L - R) * Math.log10(Math.max(s, 1)) / Math.log10(xMax);
  const y = (v) => T + (H - T - B) * (1 - v / yMax);
  const root = svg("svg", { id: "recovery-chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`,
    role: "img", "aria-label": `Recovery of reset ${d.id}: blocks, hittable and orphans `
      + "against seconds since the reset" });
  root.append(svg("title", {}, `Reset #${d.id}: recovery`));
  root.append(svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: "#9aa5b1" }));
  root.append(svg("line", { x1: L, y1: T, x2: L, y2: y(0), stroke: "#9aa5b1" }));
  for (const s of [1, 2, 5, 10, 20, 30, 60, 120, 300].filter((s) => s <= xMax)) {
    root.append(svg("line", { x1: x(s), y1: y(0), x2: x(s), y2: y(0) + 4, stroke: "#9aa5b1" }));
    root.append(svg("text", { x: x(s), y: y(0) + 16, "text-anchor": "middle" }, s + " s"));
  }
  root.append(svg("text", { x: W - R, y: H - 4, "text-anchor": "end" },
    "seconds since the reset (log scale)"));
  for (const v of [0, yMax / 2, yMax / 1.1]) {
    root.append(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, int(Math.round(v))));
  }
  const level = (v, label, dash) => {
    root.append(svg("line", { class: "level", x1: L, y1: y(v), x2: W - R, y2: y(v),
      stroke: "#9aa5b1", "stroke-dasharray": dash }));
    root.append(svg("text", { x: W - R - 4, y: y(v) - 4, "text-anchor": "end" }, label));
  };
  level(d.before_blocks, `before: ${int(d.before_blocks)} blocks`, "6 4");
  level(d.before_blocks * 0.5, "50 %", "2 4");
  level(d.before_blocks * 0.9, "90 %", "2 4");
  for (const [t, label] of [[d.t50_s, "t50"], [d.t90_s, "t90"]]) {
    if (t === null || t === undefined) continue;
    root.append(svg("line", { class: "marker", x1: x(t), y1: T, x2: x(t), y2: y(0),
      stroke: "#c62828", "stroke-dasharray": "3 3" }));
    root.append(svg("text", { x: x(t) + 3, y: T + 10 }, `${label} ${secs(t)}`));
  }
  for (const key of ["blocks", "hittable", "orphans"]) {
    const path = points.map((p, i) => `${i ? "L" : "M"}${x(p.offset_s).toFixed(1)},`
      + y(p[key]).toFixed(1)).join(" ");
    // Blocks wide and pale under hittable: the two coincide while nothing is orphaned.
    root.append(svg("path", { class: "series " + key, d: path, fill: "none",
      stroke: COLORS[key], "stroke-width": key === "blocks" ? 6 : 2,
      "stroke-opacity": key === "blocks" ? 0.35 : 1 }));
    for (const p of points) {
      const dot = svg("circle", { cx: x(p.offset_s).toFixed(1), cy: y(p[key]).toFixed(1), r: 3,
        fill: COLORS[key] });
      dot.append(svg("title", {}, `+${p.offset_s} s: ${int(p[key])} ${key}`));
      root.append(dot);
    }
  }
  const legend = el("div", { class: "legend" }, ...Object.entries(COLORS).map(([key, color]) =>
    el("span", {}, el("i", { "data-color": color }), key)));
  for (const swatch of legend.querySelectorAll("i")) {
    swatch.style.background = swatch.dataset.color;
  }
  return el("figure", { id: "recovery" }, root, legend);
}
"""
