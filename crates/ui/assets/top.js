// The top table (function, flat, flat %, cum, cum %; sortable; filter) and
// the sandwich view of one function (callers above, callees below).

import { formatValue, percent, esc } from "./format.js";
import { setState } from "./state.js";
import { flatten, sandwich, matcher } from "./flame.js";
import { Icicle } from "./icicle.js";

const COLUMNS = [
  ["name", "Function"],
  ["flat", "Flat"],
  ["flatp", "Flat %"],
  ["cum", "Cum"],
  ["cump", "Cum %"],
];

/** Sorts rows by `sort` (a column key; a leading `-` is ascending). */
export function sortRows(rows, sort) {
  const asc = sort.startsWith("-");
  let key = asc ? sort.slice(1) : sort;
  key = key === "flatp" ? "flat" : key === "cump" ? "cum" : key;
  const byName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  // Numbers descending (ties as the API orders them: cum, then name);
  // names A to Z. A leading "-" reverses.
  const cmp = key === "name" ? byName : (a, b) => b[key] - a[key] || b.cum - a.cum || byName(a, b);
  const out = [...rows].sort(cmp);
  return asc ? out.reverse() : out;
}

/** Renders the top table of `data` ({unit, total, rows}) into `main`. */
export function renderTop(main, data, s) {
  const match = matcher(s.filter);
  const rows = sortRows(
    data.rows.filter((r) => !match || match(r.name)),
    s.sort,
  );
  const shown = rows.slice(0, 2000);
  const u = data.unit;
  const head = COLUMNS.map(([k, label]) => {
    const mark = s.sort === k ? " ▼" : s.sort === "-" + k ? " ▲" : "";
    return `<th data-sort="${k}" class="${k === "name" ? "" : "num"}">${label}${mark}</th>`;
  }).join("");
  main.innerHTML = `
    <div class="toolbar"><input id="filter" placeholder="Filter functions (regex)" value="${esc(s.filter)}" spellcheck="false">
    <span class="muted">${rows.length} of ${data.rows.length} functions · total ${formatValue(data.total, u)} · ${data.profiles} profiles</span></div>
    <table id="toptable"><thead><tr>${head}<th></th></tr></thead><tbody>${shown
      .map(
        (r) => `<tr data-name="${esc(r.name)}"><td class="fn">${esc(r.name)}</td>
        <td class="num">${formatValue(r.flat, u)}</td><td class="num">${percent(r.flat, data.total)}</td>
        <td class="num">${formatValue(r.cum, u)}</td><td class="num">${percent(r.cum, data.total)}</td>
        <td><button class="sandwich" title="Sandwich: callers and callees">⇅</button></td></tr>`,
      )
      .join("")}</tbody></table>`;
  const filter = main.querySelector("#filter");
  filter.onchange = () => setState({ filter: filter.value }, true);
  main.querySelectorAll("th[data-sort]").forEach((th) => {
    th.onclick = () => {
      const k = th.dataset.sort;
      setState({ sort: s.sort === k ? "-" + k : k }, true);
    };
  });
  main.querySelectorAll("tbody tr").forEach((tr) => {
    tr.onclick = (e) => {
      const name = tr.dataset.name;
      if (e.target.classList.contains("sandwich")) setState({ view: "sandwich", fn: name });
      else setState({ view: "icicle", focus: name, zoom: "", search: "" });
    };
  });
}

/** Renders the sandwich of `s.fn` from the flame graph `tree`. */
export function renderSandwich(main, tree, s, unit, tooltip, names) {
  main.innerHTML = `<div class="toolbar"><label>Function <input id="fn" list="fnlist" value="${esc(s.fn)}" size="60" spellcheck="false"></label>
    <datalist id="fnlist">${names.slice(0, 500).map((n) => `<option value="${esc(n)}">`).join("")}</datalist></div>
    <h3>Callers of <code>${esc(s.fn || "…")}</code></h3><div id="callers" class="inverted"></div>
    <h3>Callees of <code>${esc(s.fn || "…")}</code></h3><div id="callees"></div>`;
  main.querySelector("#fn").onchange = (e) => setState({ fn: e.target.value });
  if (!s.fn) {
    main.insertAdjacentHTML("beforeend", `<p class="muted">Pick a function (or click ⇅ in the top table).</p>`);
    return [];
  }
  const f = flatten(tree);
  const sw = sandwich(f, s.fn);
  if (sw.callees.value === 0) {
    main.insertAdjacentHTML("beforeend", `<p class="muted">No frame named ${esc(s.fn)} in this selection.</p>`);
    return [];
  }
  const make = (id, t) => {
    const ic = new Icicle(main.querySelector(id), { unit, tooltip, onZoom: null });
    ic.set(flatten(t));
    return ic;
  };
  return [make("#callers", sw.callers), make("#callees", sw.callees)];
}
