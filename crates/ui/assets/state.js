// View state lives in the URL's query string: a link reproduces the view,
// and back/forward walk through views. Every change goes through setState,
// which updates the URL and tells the app to render.

const DEFAULTS = {
  type: "", // profile type, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds
  q: "{}", // the label part of the selector
  from: "now-1h", // API time forms: now-<d>, unix ms, RFC 3339
  to: "now",
  group: "", // query_range group_by label
  view: "icicle", // icicle | top | sandwich | compare
  zoom: "", // the zoomed frame as its path: root;…;frame
  search: "", // regex (or text) highlighted in the icicle graph
  focus: "", // a function focused from the top table
  fn: "", // the sandwich view's function
  sort: "flat", // top table sort column; a leading - sorts ascending
  filter: "", // top table filter
  bq: "", // compare: B's label selector (A's when empty)
  bfrom: "", // compare: B's range (A's when empty)
  bto: "",
  tenant: "", // sent as X-Scope-OrgID
};

/** The current state: defaults overlaid with the URL's parameters. */
export function getState() {
  const p = new URLSearchParams(location.search);
  const s = { ...DEFAULTS };
  for (const k of Object.keys(DEFAULTS)) {
    if (p.has(k)) s[k] = p.get(k);
  }
  return s;
}

/** Merges `patch` into the state and records it in the URL (a new history
 * entry unless `replace`); then emits `statechange`. */
export function setState(patch, replace = false) {
  const s = { ...getState(), ...patch };
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(s)) {
    if (v !== DEFAULTS[k] && v !== undefined && v !== null) p.set(k, v);
  }
  const url = location.pathname + (p.toString() ? "?" + p : "");
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  window.dispatchEvent(new Event("statechange"));
}

/** The full selector of side A: profile type and labels. */
export function selectorA(s) {
  return s.type + (s.q.trim() || "{}");
}

/** Side B of a comparison: its selector and range (A's where not given). */
export function sideB(s) {
  return {
    query: s.type + (s.bq.trim() || s.q.trim() || "{}"),
    start: s.bfrom || s.from,
    end: s.bto || s.to,
  };
}
