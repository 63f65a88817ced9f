// The metrics graph: one line per series of query_range, a time axis, and
// drag-to-select a range (which becomes the range the graphs below merge).
// In compare mode it holds both sides: B's lines are dashed, and the A and B
// windows are shaded.

import { formatValue, esc } from "./format.js";

const PAD = { l: 64, r: 12, t: 8, b: 22 };
const COLOURS = ["#3b6fd8", "#d8553b", "#2d9d5a", "#9b4fd0", "#c79a1c", "#1c9cc7", "#c71c7a", "#666"];

/** Draws `series` ([{labels, points: [[ms, v]], side?: "A" | "B"}]) on
 * `canvas` between `start` and `end` (ms); `windows` ([{from, to, side}])
 * are shaded; `onSelect(fromMs, toMs)` is called after a drag. Returns the
 * windows' labels as drawn (["A", "B"], or ["A = B"] for one range). */
export function drawChart(canvas, legend, series, start, end, unit, onSelect, windows = []) {
  const dpr = window.devicePixelRatio || 1;
  const box = canvas.parentElement;
  const cs = getComputedStyle(box);
  const W = box.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) || 800;
  const H = 140;
  canvas.style.width = W + "px";
  canvas.style.height = H + "px";
  canvas.width = W * dpr;
  canvas.height = H * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  let max = 0;
  for (const s of series) for (const [, v] of s.points) max = Math.max(max, v);
  max = max || 1;
  const x = (t) => PAD.l + ((t - start) / Math.max(end - start, 1)) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / max) * (H - PAD.t - PAD.b);
  // Axes and grid.
  ctx.strokeStyle = "#ddd";
  ctx.fillStyle = "#666";
  ctx.font = "11px system-ui, sans-serif";
  for (let k = 0; k <= 2; k++) {
    const v = (max * k) / 2;
    ctx.beginPath();
    ctx.moveTo(PAD.l, y(v));
    ctx.lineTo(W - PAD.r, y(v));
    ctx.stroke();
    ctx.fillText(formatValue(Math.round(v), unit), 4, y(v) + 4);
  }
  const span = end - start;
  // Windows: shaded in their side's colour. Identical windows (A and B the
  // same range, e.g. two label sets over one time range) share one label
  // "A = B"; labels that would overlap are stacked.
  const labelled = [];
  for (const w of windows) {
    const a = x(Math.max(w.from, start));
    const b = x(Math.min(w.to, end));
    ctx.fillStyle = w.side === "B" ? "rgba(216,85,59,0.08)" : "rgba(59,111,216,0.08)";
    ctx.fillRect(a, PAD.t, Math.max(b - a, 1), H - PAD.t - PAD.b);
    const same = labelled.find((l) => l.from === w.from && l.to === w.to);
    if (same) {
      same.text += " = " + w.side;
      continue;
    }
    const row = labelled.filter((l) => Math.abs(l.a - a) < 28).length;
    labelled.push({ from: w.from, to: w.to, a, row, text: w.side });
  }
  ctx.fillStyle = "#666";
  for (const l of labelled) ctx.fillText(l.text, l.a + 3, PAD.t + 11 + 12 * l.row);
  for (let k = 0; k <= 4; k++) {
    const t = start + (span * k) / 4;
    const d = new Date(t);
    const label = span > 2 * 86400e3 ? d.toLocaleDateString() : d.toLocaleTimeString();
    ctx.fillText(label, Math.min(x(t) - 20, W - 70), H - 6);
  }
  series.forEach((s, i) => {
    ctx.strokeStyle = COLOURS[i % COLOURS.length];
    ctx.lineWidth = 1.5;
    ctx.setLineDash(s.side === "B" ? [5, 3] : []);
    ctx.beginPath();
    s.points.forEach(([t, v], k) => (k ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    if (s.points.length === 1) {
      const [t, v] = s.points[0];
      ctx.fillStyle = ctx.strokeStyle;
      ctx.fillRect(x(t) - 2, y(v) - 2, 4, 4);
    }
  });
  ctx.setLineDash([]);
  legend.innerHTML = series
    .slice(0, 20)
    .map((s, i) => {
      const l = (s.side ? s.side + ": " : "") + (Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "all");
      return `<span><i style="background:${COLOURS[i % COLOURS.length]}"></i>${esc(l)}</span>`;
    })
    .join("");
  // Drag to select: the canvas keeps one handler set, replaced on redraw.
  const image = ctx.getImageData(0, 0, canvas.width, canvas.height);
  const toTime = (px) => start + ((px - PAD.l) / (W - PAD.l - PAD.r)) * span;
  let from = null;
  canvas.onmousedown = (e) => {
    from = e.offsetX;
  };
  canvas.onmousemove = (e) => {
    if (from === null) return;
    ctx.putImageData(image, 0, 0);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "rgba(59,111,216,0.18)";
    ctx.fillRect(Math.min(from, e.offsetX), PAD.t, Math.abs(e.offsetX - from), H - PAD.t - PAD.b);
  };
  canvas.onmouseup = (e) => {
    if (from === null) return;
    const a = Math.min(from, e.offsetX);
    const b = Math.max(from, e.offsetX);
    from = null;
    if (b - a >= 3) onSelect(Math.round(toTime(a)), Math.round(toTime(b)));
    else ctx.putImageData(image, 0, 0);
  };
  return labelled.map((l) => l.text);
}
