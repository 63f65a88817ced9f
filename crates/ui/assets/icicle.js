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

  /** Draws the graph; returns the number of nodes drawn. */
  draw() {
    const f = this.f;
    if (!f) return 0;
    const t0 = performance.now();
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
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    this.rows = Array.from({ length: depthMax + 1 }, () => []);
    this.W = W;
    let drawn = 0;
    const rootL = f.diff ? f.left[0] : 0;
    const rootR = f.diff ? f.right[0] : 0;
    const rect = (i, x, w) => {
      const d = f.depth[i];
      let fill;
      if (this.marks && !this.marks[i]) fill = "#e8e8e8";
      else if (this.marks) fill = "#f2a93b";
      else if (f.diff) fill = diffColour(f.left[i], f.right[i], rootL, rootR);
      else fill = colourOf(f.name[i]);
      ctx.fillStyle = fill;
      const y = d * ROW;
      ctx.fillRect(x, y, Math.max(w - 0.5, 0.5), ROW - 1);
      if (w > 4 * CHAR) {
        const max = Math.floor((w - 6) / CHAR);
        const name = f.name[i];
        ctx.fillStyle = "#111";
        ctx.fillText(name.length > max ? name.slice(0, max - 1) + "…" : name, x + 3, y + ROW / 2);
      }
      this.rows[d].push(i, x, w);
      drawn++;
    };
    // Ancestors of the zoomed node (and the node itself) span the width.
    for (let a = z; a >= 0; a = f.parent[a]) rect(a, 0, W);
    const scale = W / Math.max(f.value[z], 1);
    const z0 = f.start[z];
    for (let i = z + 1; i < f.end[z]; ) {
      const w = f.value[i] * scale;
      if (w < 0.33) {
        i = f.end[i]; // its descendants are narrower still
        continue;
      }
      rect(i, (f.start[i] - z0) * scale, w);
      i++;
    }
    this.lastDraw = { ms: performance.now() - t0, nodes: drawn };
    return drawn;
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
