// Value formatting in a profile type's unit, and small text helpers.

/** Formats `v` in `unit`: nanoseconds as s/ms/µs, bytes as kB/MB/GB, others as counts. */
export function formatValue(v, unit) {
  const a = Math.abs(v);
  if (unit === "nanoseconds") {
    if (a >= 1e9) return fixed(v / 1e9) + " s";
    if (a >= 1e6) return fixed(v / 1e6) + " ms";
    if (a >= 1e3) return fixed(v / 1e3) + " µs";
    return v + " ns";
  }
  if (unit === "bytes") {
    if (a >= 1e9) return fixed(v / 1e9) + " GB";
    if (a >= 1e6) return fixed(v / 1e6) + " MB";
    if (a >= 1e3) return fixed(v / 1e3) + " kB";
    return v + " B";
  }
  if (a >= 1e9) return fixed(v / 1e9) + " G";
  if (a >= 1e6) return fixed(v / 1e6) + " M";
  if (a >= 1e4) return fixed(v / 1e3) + " k";
  return String(v);
}

/** Three significant digits at most. */
function fixed(x) {
  return Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2);
}

/** `part / whole` as a percentage with two decimals. */
export function percent(part, whole) {
  return whole ? ((100 * part) / whole).toFixed(2) + " %" : "–";
}

/** A signed percentage-point change, e.g. `+1.25 pp`. */
export function points(delta) {
  const s = (100 * delta).toFixed(2);
  return (delta > 0 ? "+" : "") + s + " pp";
}

/** Escapes `s` for use as a literal inside a regular expression. */
export function escapeRegex(s) {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/** Escapes text for HTML. */
export function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** The sample unit of a profile type string `name:type:unit:ptype:punit`. */
export function unitOf(profileType) {
  return (profileType || "").split(":")[2] || "";
}
