// The page: reads the state from the URL, fetches what the current view
// needs from the API (answers cached by URL, so zoom and search do not
// refetch), and renders the query bar, the metrics graph and the view.
// Errors are shown with the API's message; with no data, the page says how
// to send some.

import { getJson, fetchOk, apiUrl } from "./api.js";
import { getState, setState, selectorA, sideB } from "./state.js";
import { formatValue, percent, esc, unitOf, escapeRegex } from "./format.js";
import { flatten, pathOf, findPath, widest, matcher } from "./flame.js";
import { Icicle } from "./icicle.js";
import { drawChart } from "./chart.js";
import { initQueryBar, syncQueryBar, toMs } from "./explore.js";
import { renderTop, renderSandwich } from "./top.js";
import { renderChanges } from "./compare.js";

const $ = (id) => document.getElementById(id);
const MAX_NODES = 50000;

/** What tests and benchmarks read: the rendered view's essentials, and the
 * metrics graph's series. */
window.fathomView = { ready: false };
window.fathomChart = null;
window.fathomTimings = {};

// Answers by URL (and tenant); a few recent ones are kept.
const cache = new Map();
function cached(key, load) {
  const k = getState().tenant + " " + key;
  if (!cache.has(k)) {
    const p = load();
    cache.set(k, p);
    p.catch(() => cache.delete(k));
    if (cache.size > 16) cache.delete(cache.keys().next().value);
  }
  return cache.get(k);
}
const json = (path, params) => cached(apiUrl(path, params), () => getJson(path, params));

// Flattened trees by answer object: re-rendering the same answer (zoom,
// search) does not flatten it again.
const flatCache = new WeakMap();
function flat(tree, diff) {
  let f = flatCache.get(tree);
  if (!f) {
    f = flatten(tree, diff);
    flatCache.set(tree, f);
  }
  return f;
}

let icicles = [];
let renderSeq = 0;

function showError(msg) {
  const e = $("error");
  e.textContent = msg;
  e.hidden = !msg;
}

/** The empty state: how to send profiles. */
function emptyState(s) {
  const host = location.origin;
  const tenant = s.tenant ? ` -H 'X-Scope-OrgID: ${s.tenant}'` : "";
  $("chartbox").hidden = true;
  $("main").innerHTML = `<div class="empty" id="empty">
    <h2>No profiles in this time range${s.tenant ? ` for tenant <code>${esc(s.tenant)}</code>` : ""}</h2>
    <p>Send some, then pick a longer range if needed:</p>
    <h4>The eBPF agent (every process on a Linux host, no code changes)</h4>
    <pre>sudo fathom agent --remote ${esc(host)}${s.tenant ? " --tenant " + esc(s.tenant) : ""}</pre>
    <h4>With curl: folded stacks, or a pprof file</h4>
    <pre>printf 'main;handler;json.Marshal 42\\nmain;gc 7\\n' |
  curl -g${esc(tenant)} --data-binary @- '${esc(host)}/ingest?name=myapp.cpu{env=prod}&amp;format=folded'

curl -g${esc(tenant)} --data-binary @cpu.pb.gz '${esc(host)}/ingest?name=myapp.cpu{env=prod}&amp;format=pprof'</pre>
    <h4>Any Pyroscope SDK</h4>
    <pre>server address: ${esc(host)}    (e.g. Go: pyroscope.Config{ServerAddress: "${esc(host)}"})</pre>
  </div>`;
  window.fathomView = { ready: true, view: "empty" };
}

async function render() {
  const my = ++renderSeq;
  const s = getState();
  showError("");
  for (const ic of icicles) ic.destroy();
  icicles = [];
  $("tooltip").hidden = true;
  $("linkbox").hidden = true;
  document.querySelectorAll("#views button").forEach((b) => b.classList.toggle("active", b.dataset.view === s.view));
  $("compareform").hidden = s.view !== "compare";
  window.fathomView = { ready: false, view: s.view };
  window.fathomChart = null; // the metrics graph's series, once drawn
  try {
    const types = (await json("/api/v1/profile_types", { start: s.from, end: s.to })).profile_types;
    if (my !== renderSeq) return;
    syncQueryBar(s, types);
    if (!types.length) return emptyState(s);
    if (!types.includes(s.type)) {
      const pick = types.find((t) => t.startsWith("process_cpu:cpu:")) || types.find((t) => t.includes(":cpu:")) || types[0];
      return setState({ type: pick }, true);
    }
    $("chartbox").hidden = false;
    $("adesc").textContent = `${selectorA(s)} · ${new Date(toMs(s.from)).toLocaleString()} – ${new Date(toMs(s.to)).toLocaleString()}`;
    const chart = renderChart(s);
    const main = renderView(s, my);
    await Promise.all([chart, main]);
  } catch (e) {
    if (my !== renderSeq) return;
    showError(e.message);
    window.fathomView = { ready: true, view: s.view, error: e.message };
  }
}

async function renderChart(s) {
  let start = toMs(s.from);
  let end = toMs(s.to);
  const params = { query: selectorA(s), start: String(start), end: String(end), group_by: s.group };
  if (s.view !== "compare") {
    const r = await json("/api/v1/query_range", params);
    drawChart($("chart"), $("legend"), r.series, start, end, unitOf(s.type), (a, b) =>
      setState({ from: String(a), to: String(b), zoom: "" }),
    );
    window.fathomChart = r.series.map((x) => ({ labels: x.labels, points: x.points.length }));
    return;
  }
  // Compare: both sides over the span of both windows; a drag selects A's
  // range.
  const b = sideB(s);
  const [bStart, bEnd] = [toMs(b.start), toMs(b.end)];
  const both = { start: String(Math.min(start, bStart)), end: String(Math.max(end, bEnd)) };
  const [ra, rb] = await Promise.all([
    json("/api/v1/query_range", { ...params, ...both }),
    json("/api/v1/query_range", { ...params, ...both, query: b.query }),
  ]);
  const windows = [
    { from: start, to: end, side: "A" },
    { from: bStart, to: bEnd, side: "B" },
  ];
  const inside = (w) => (x) => ({ ...x, side: w.side, points: x.points.filter(([t]) => t >= w.from && t <= w.to) });
  // Series with no point inside their own window are left out.
  const series = [...ra.series.map(inside(windows[0])), ...rb.series.map(inside(windows[1]))].filter(
    (x) => x.points.length,
  );
  [start, end] = [Number(both.start), Number(both.end)];
  const marks = drawChart($("chart"), $("legend"), series, start, end, unitOf(s.type), (a, z) =>
    setState({ from: String(a), to: String(z), zoom: "" }), windows,
  );
  window.fathomChart = series.map((x) => ({ side: x.side, labels: x.labels, points: x.points.length, marks }));
}

function flameParams(s) {
  return { query: selectorA(s), start: s.from, end: s.to, format: "flamegraph", max_nodes: MAX_NODES };
}

async function renderView(s, my) {
  const main = $("main");
  const unit = unitOf(s.type);
  if (s.view === "top") {
    const data = await json("/api/v1/query", { query: selectorA(s), start: s.from, end: s.to, format: "top" });
    if (my !== renderSeq) return;
    renderTop(main, data, s);
    window.fathomView = { ready: true, view: "top", rows: data.rows.length, total: data.total };
    return;
  }
  if (s.view === "compare") return renderCompare(main, s, unit, my);
  const tree = await json("/api/v1/query", flameParams(s));
  if (my !== renderSeq) return;
  if (s.view === "sandwich") {
    const names = [...new Set(flat(tree, false).name)].sort();
    icicles = renderSandwich(main, tree, s, unit, $("tooltip"), names);
    window.fathomView = {
      ready: true,
      view: "sandwich",
      callers: icicles[0] ? icicles[0].f.value[0] : 0,
      callees: icicles[1] ? icicles[1].f.value[0] : 0,
    };
    return;
  }
  renderIcicle(main, tree, s, unit, false);
}

/** The icicle view (also the diff graph of compare): toolbar, breadcrumb,
 * search and the graph. */
function renderIcicle(main, tree, s, unit, diff, host = main) {
  const t0 = performance.now();
  const f = flat(tree, diff);
  let zoom = findPath(f, s.zoom);
  if (!s.zoom && s.focus) zoom = Math.max(widest(f, s.focus), 0);
  const search = s.search || (s.focus ? "^" + escapeRegex(s.focus) + "$" : "");
  const match = matcher(search);
  const crumbs = [];
  for (let a = zoom; a >= 0; a = f.parent[a]) crumbs.unshift(a);
  host.innerHTML = `<div class="toolbar">
      <nav id="breadcrumb">${crumbs.map((i) => `<a href="#" data-i="${i}">${esc(f.name[i])}</a>`).join(" › ")}</nav>
      <input id="search" placeholder="Search frames (regex)" value="${esc(search)}" spellcheck="false">
      <span id="searchshare" class="muted"></span>
      <span class="muted">${f.name.length} nodes · total ${formatValue(f.value[0], unit)}</span>
    </div><div id="graph"></div>`;
  const ic = new Icicle(host.querySelector("#graph"), {
    unit,
    tooltip: $("tooltip"),
    onZoom: (i) => setState({ zoom: pathOf(f, i), focus: "" }),
  });
  icicles.push(ic);
  ic.set(f, zoom, match);
  if (ic.searchResult) {
    host.querySelector("#searchshare").textContent = `matches: ${formatValue(ic.searchResult.total, unit)} (${percent(ic.searchResult.total, f.value[0])} of total)`;
  }
  host.querySelectorAll("#breadcrumb a").forEach((a) => {
    a.onclick = (e) => {
      e.preventDefault();
      setState({ zoom: pathOf(f, Number(a.dataset.i)), focus: "" });
    };
  });
  const input = host.querySelector("#search");
  input.onchange = () => setState({ search: input.value, focus: "" }, true);
  // The children of the zoomed node, widest first: what tests compare
  // with the API.
  const kids = [];
  for (let c = zoom + 1; c < f.end[zoom]; c = f.end[c]) kids.push({ name: f.name[c], value: f.value[c] });
  kids.sort((a, b) => b.value - a.value || (a.name < b.name ? -1 : 1));
  if (!window.fathomTimings.firstPaint) window.fathomTimings.firstPaint = performance.now();
  window.fathomView = {
    ready: true,
    view: diff ? "compare" : "icicle",
    zoomPath: pathOf(f, zoom),
    zoomName: f.name[zoom],
    zoomValue: f.value[zoom],
    widest: kids.slice(0, 20),
    nodes: f.name.length,
    drawn: ic.lastDraw.nodes,
    drawMs: ic.lastDraw.ms,
    renderMs: performance.now() - t0,
    searchTotal: ic.searchResult ? ic.searchResult.total : null,
  };
  window.fathomIcicle = ic;
  return ic;
}

async function renderCompare(main, s, unit, my) {
  const b = sideB(s);
  const params = {
    left: selectorA(s),
    left_start: s.from,
    left_end: s.to,
    right: b.query,
    right_start: b.start,
    right_end: b.end,
  };
  const [tree, changes] = await Promise.all([
    json("/api/v1/diff", { ...params, format: "flamegraph", max_nodes: MAX_NODES }),
    json("/api/v1/changes", { ...params, limit: 200 }),
  ]);
  if (my !== renderSeq) return;
  main.innerHTML = `<div id="changesbox"></div><h3>Diff icicle <span class="muted">(width: A + B; red: larger share in B, green: smaller)</span></h3><div id="diffbox"></div>`;
  renderChanges(main.querySelector("#changesbox"), changes);
  renderIcicle(main, tree, s, unit, true, main.querySelector("#diffbox"));
  window.fathomView.changes = changes.changes.slice(0, 20).map((c) => ({ name: c.name, significant: c.significant, delta: c.delta_share }));
}

/** Downloads the current selection as pprof (B's side in compare). */
async function download() {
  const s = getState();
  const b = sideB(s);
  const [query, start, end] = s.view === "compare" ? [b.query, b.start, b.end] : [selectorA(s), s.from, s.to];
  try {
    const r = await fetchOk("/api/v1/query", { query, start, end, format: "pprof" });
    const blob = await r.blob();
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "profile.pb.gz";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  } catch (e) {
    showError(e.message);
  }
}

async function copyLink() {
  const btn = $("copylink");
  try {
    await navigator.clipboard.writeText(location.href);
    btn.textContent = "Copied";
  } catch {
    // No clipboard permission (plain http, headless): show the link,
    // selected, for a manual copy.
    const box = $("linkbox");
    box.value = location.href;
    box.hidden = false;
    box.select();
    btn.textContent = "Select and copy";
  }
  setTimeout(() => (btn.textContent = "Copy link"), 1500);
}

function init() {
  initQueryBar();
  document.querySelectorAll("#views button").forEach((b) => (b.onclick = () => setState({ view: b.dataset.view })));
  $("download").onclick = download;
  $("copylink").onclick = copyLink;
  window.addEventListener("statechange", render);
  window.addEventListener("popstate", render);
  render();
}

init();
