// The icicle graph on a canvas: root at the top, one row per stack depth.
// Drawing is one pass over the flattened tree (flame.js) that skips every
// subtree narrower than a third of a pixel, so 50,000 visible nodes redraw
// in a few milliseconds. Hovering shows a tooltip; clicking zooms.

import { formatValue, percent, points, esc } from "./format.js";
import { search as searchNodes } from "./flame.js";

const ROW = 18; // px per depth
const FONT = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
const CHAR = 7.2; // approximate width of one character of FONT

/** A stable hash of a string (FNV-1a), for colours. */
function hash(s) {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

/** The package, class or binary a frame belongs to, which picks its colour:
 * `a::b::f` → `a::b`, `github.com/x/y.(*T).f` → `github.com/x/y`,
 * `org.apache.kafka.Foo.bar` → `org.apache.kafka`, `java/util/Map.get` →
 * `java/util/`, `libc.so.6` stays. */
export function packageOf(name) {
  if (name.includes("::")) return name.split("::").slice(0, 2).join("::");
  const slash = name.lastIndexOf("/");
  const head = name.slice(0, slash + 1);
  const parts = name.slice(slash + 1).split(".");
  // `java/util/HashMap.get`: a JVM class in a package path; the package.
  if (slash > 0 && /^[A-Z]/.test(parts[0])) return head;
  if (parts.length > 3) return head + parts.slice(0, parts.length - 2).join(".");
  return head + parts[0];
}

/** The colour of a frame in a plain graph: stable per package. */
function colourOf(name) {
  if (name === "other") return "#c8c8c8";
  const h = hash(packageOf(name));
  return `hsl(${h % 360}, ${45 + (h >> 9) % 25}%, ${62 + (h >> 17) % 12}%)`;
}

/** The colour of a frame in a diff: red grows in B, green shrinks, by the
 * relative change of its share of the total. */
function diffColour(l, r, lt, rt) {
  const a = lt ? l / lt : 0;
  const b = rt ? r / rt : 0;
  if (a === 0 && b === 0) return "#ddd";
  const rel = a === 0 ? 1 : Math.max(-1, Math.min(1, (b - a) / a));
  if (Math.abs(rel) < 0.02) return "#d9d9d9";
  const light = 88 - 40 * Math.abs(rel);
  return rel > 0 ? `hsl(0, 80%, ${light}%)` : `hsl(130, 55%, ${light}%)`;
}

export class Icicle {
  /**
   * @param {HTMLElement} host where the canvas goes
   * @param {object} opts {unit, onZoom(index), tooltip: HTMLElement}
   */
  constructor(host, opts) {
    this.opts = opts;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "icicle";
    host.appendChild(this.canvas);
    this.f = null;
    this.zoom = 0;
    this.marks = null;
    this.rows = []; // per depth: drawn node indices, for hit-testing
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => (this.opts.tooltip.hidden = true));
    this.canvas.addEventListener("click", (e) => {
      const i = this.hit(e);
      if (i >= 0 && this.opts.onZoom) this.opts.onZoom(i);
    });
    this.resize = () => this.draw();
    window.addEventListener("resize", this.resize);
  }

  /** Sets the tree, the zoomed node and the search marks; draws. */
  set(f, zoom = 0, match = null) {
    this.f = f;
    this.zoom = zoom;
    this.searchResult = match ? searchNodes(f, match) : null;
    this.marks = this.searchResult ? this.searchResult.marks : null;
    this.draw();
  }

  /** The colour of every node for the current mode, as indices into
   * `palette` (computed once per tree and mode, not per draw). */
  colours() {
    const f = this.f;
    const key = this.marks ? "marks" : f.diff ? "diff" : "plain";
    // Kept on the tree, so a new graph of the same tree (a zoom re-renders
    // the view) reuses them; search marks change with the search.
    f.colourCache ||= {};
    const hit = f.colourCache[key];
    if (hit && key !== "marks") {
      [this.palette, this.col] = hit;
      return;
    }
    const n = f.name.length;
    const palette = [];
    const index = new Map();
    const idx = (c) => {
      let i = index.get(c);
      if (i === undefined) {
        i = palette.length;
        palette.push(c);
        index.set(c, i);
      }
      return i;
    };
    const col = new Uint16Array(n);
    for (let i = 0; i < n; i++) {
      let c;
      if (this.marks) c = this.marks[i] ? "#f2a93b" : "#e8e8e8";
      else if (f.diff) c = diffColour(f.left[i], f.right[i], f.left[0], f.right[0]);
      else c = colourOf(f.name[i]);
      col[i] = idx(c);
    }
    this.palette = palette;
    this.col = col;
    f.colourCache[key] = [palette, col];
  }

  /** Draws the graph; returns the number of nodes drawn. Rectangles are
   * gathered first and filled one colour at a time: setting a canvas
   * colour costs more than drawing a rectangle. */
  draw() {
    const f = this.f;
    if (!f) return 0;
    const t0 = performance.now();
    this.colours();
    const dpr = window.devicePixelRatio || 1;
    const W = this.canvas.parentElement.clientWidth || 800;
    const z = this.zoom;
    // Rows: the zoomed node's ancestors and its subtree.
    let depthMax = f.depth[z];
    for (let i = z; i < f.end[z]; i++) if (f.depth[i] > depthMax) depthMax = f.depth[i];
    const H = (depthMax + 1) * ROW;
    this.canvas.style.width = W + "px";
    this.canvas.style.height = H + "px";
    this.canvas.width = Math.round(W * dpr);
    this.canvas.height = Math.round(H * dpr);
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.rows = Array.from({ length: depthMax + 1 }, () => []);
    this.W = W;
    // Pass 1: the visible nodes and their geometry.
    const idx = [];
    const xs = [];
    const ws = [];
    const visit = (i, x, w) => {
      idx.push(i);
      xs.push(x);
      ws.push(w);
      this.rows[f.depth[i]].push(i, x, w);
    };
    // Ancestors of the zoomed node (and the node itself) span the width.
    for (let a = z; a >= 0; a = f.parent[a]) visit(a, 0, W);
    const scale = W / Math.max(f.value[z], 1);
    const z0 = f.start[z];
    for (let i = z + 1; i < f.end[z]; ) {
      const w = f.value[i] * scale;
      if (w < 0.33) {
        i = f.end[i]; // its descendants are narrower still
        continue;
      }
      visit(i, (f.start[i] - z0) * scale, w);
      i++;
    }
    // Pass 2: rectangles, one path and one fill per colour.
    const byColour = Array.from({ length: this.palette.length }, () => []);
    for (let k = 0; k < idx.length; k++) byColour[this.col[idx[k]]].push(k);
    for (let c = 0; c < byColour.length; c++) {
      const ks = byColour[c];
      if (!ks.length) continue;
      ctx.fillStyle = this.palette[c];
      ctx.beginPath();
      for (const k of ks) ctx.rect(xs[k], f.depth[idx[k]] * ROW, Math.max(ws[k] - 0.5, 0.5), ROW - 1);
      ctx.fill();
    }
    // Pass 3: labels of the nodes wide enough for a few characters.
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    ctx.fillStyle = "#111";
    for (let k = 0; k < idx.length; k++) {
      const w = ws[k];
      if (w <= 4 * CHAR) continue;
      const i = idx[k];
      const max = Math.floor((w - 6) / CHAR);
      const name = f.name[i];
      ctx.fillText(name.length > max ? name.slice(0, max - 1) + "…" : name, xs[k] + 3, f.depth[i] * ROW + ROW / 2);
    }
    this.lastDraw = { ms: performance.now() - t0, nodes: idx.length };
    return idx.length;
  }

  /** The node under a mouse event, or -1. */
  hit(e) {
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left;
    const d = Math.floor((e.clientY - r.top) / ROW);
    const row = this.rows[d];
    if (!row) return -1;
    for (let k = 0; k < row.length; k += 3) {
      if (x >= row[k + 1] && x < row[k + 1] + row[k + 2]) return row[k];
    }
    return -1;
  }

  hover(e) {
    const tip = this.opts.tooltip;
    const i = this.hit(e);
    if (i < 0) {
      tip.hidden = true;
      return;
    }
    const f = this.f;
    const u = this.opts.unit;
    let html = `<b>${esc(f.name[i])}</b><br>`;
    if (f.diff) {
      const lt = f.left[0];
      const rt = f.right[0];
      const a = lt ? f.left[i] / lt : 0;
      const b = rt ? f.right[i] / rt : 0;
      html +=
        `A: ${formatValue(f.left[i], u)} (${percent(f.left[i], lt)}), self ${formatValue(f.selfLeft[i], u)}<br>` +
        `B: ${formatValue(f.right[i], u)} (${percent(f.right[i], rt)}), self ${formatValue(f.selfRight[i], u)}<br>` +
        `change of share: ${points(b - a)}`;
    } else {
      html +=
        `total: ${formatValue(f.value[i], u)} (${percent(f.value[i], f.value[0])})<br>` +
        `self: ${formatValue(f.self[i], u)} (${percent(f.self[i], f.value[0])})`;
    }
    tip.innerHTML = html;
    tip.hidden = false;
    tip.style.left = Math.min(e.pageX + 12, window.scrollX + window.innerWidth - 340) + "px";
    tip.style.top = e.pageY + 14 + "px";
  }

  destroy() {
    window.removeEventListener("resize", this.resize);
  }
}
