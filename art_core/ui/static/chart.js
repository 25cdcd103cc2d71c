// Line charts as plain SVG: series of [step, value, band] points, a band drawn as mean +- band.
// No chart library: a few dozen lines draw what the run page needs, and nothing is fetched.
"use strict";

const ART_COLORS = ["#2f5fd0", "#d0572f", "#3f9f4f", "#8a3fd0", "#c09020", "#1f9fb0"];

function artNiceTicks(lo, hi, count) {
  if (!(hi > lo)) { return [lo]; }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) { ticks.push(t); }
  return ticks;
}

function artFormat(value) {
  if (value === null || value === undefined) { return ""; }
  const a = Math.abs(value);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) { return value.toExponential(2); }
  return (Math.round(value * 1000) / 1000).toString();
}

// Returns an <svg> element drawing `series` ([{label, points: [[step, value, band]]}]).
function artLineChart(series, opts) {
  const W = 440, H = 190, L = 48, R = 10, T = 8, B = 24;
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const all = series.flatMap(s => s.points);
  const steps = all.map(p => p[0]);
  const lows = all.map(p => p[1] - (p[2] || 0)), highs = all.map(p => p[1] + (p[2] || 0));
  let x0 = Math.min(...steps), x1 = Math.max(...steps);
  let y0 = Math.min(...lows), y1 = Math.max(...highs);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const x = s => L + (s - x0) / (x1 - x0) * (W - L - R);
  const y = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const el = (name, attrs, parent) => {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) { node.setAttribute(k, v); }
    (parent || svg).appendChild(node);
    return node;
  };
  el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"});
  el("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"});
  for (const t of artNiceTicks(y0, y1, 4)) {
    el("line", {x1: L - 3, y1: y(t), x2: L, y2: y(t), class: "axis"});
    el("text", {x: L - 5, y: y(t) + 3, "text-anchor": "end"}).textContent = artFormat(t);
  }
  for (const t of artNiceTicks(x0, x1, 6).filter(t => Number.isInteger(t))) {
    el("text", {x: x(t), y: H - B + 13, "text-anchor": "middle"}).textContent = t;
  }
  el("text", {x: W - R, y: H - 2, "text-anchor": "end"}).textContent = "step";
  series.forEach((s, i) => {
    const color = ART_COLORS[i % ART_COLORS.length];
    const banded = s.points.filter(p => p[2] !== null && p[2] !== undefined);
    if (banded.length > 1) {
      const upper = banded.map(p => `${x(p[0])},${y(p[1] + p[2])}`);
      const lower = banded.slice().reverse().map(p => `${x(p[0])},${y(p[1] - p[2])}`);
      el("polygon", {points: upper.concat(lower).join(" "), fill: color, "fill-opacity": 0.12,
                     class: "band"});
    }
    el("polyline", {points: s.points.map(p => `${x(p[0])},${y(p[1])}`).join(" "), fill: "none",
                    stroke: color, "stroke-width": 1.6, class: "line"});
    for (const p of s.points) {
      const dot = el("circle", {cx: x(p[0]), cy: y(p[1]), r: 2.6, fill: color, class: "point",
                                "data-series": s.label, "data-step": p[0], "data-value": p[1]});
      el("title", {}, dot).textContent =
        `${s.label} at step ${p[0]}: ${artFormat(p[1])}` + (p[2] != null ? ` ± ${artFormat(p[2])}` : "");
    }
  });
  return svg;
}
