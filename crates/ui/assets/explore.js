// The query bar: profile-type picker, label selector with autocompletion
// of label names and values, time range presets and absolute ranges,
// group-by; and the time helpers the other views share.

import { getJson } from "./api.js";
import { getState, setState } from "./state.js";
import { esc } from "./format.js";

const $ = (id) => document.getElementById(id);

/** Milliseconds since the epoch for an API time form (now, now-1h, ms, RFC 3339). */
export function toMs(t, now = Date.now()) {
  if (!t || t === "now") return now;
  const rel = /^now-(\d+)([smhdw])$/.exec(t);
  if (rel) {
    const unit = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3, w: 7 * 86400e3 }[rel[2]];
    return now - Number(rel[1]) * unit;
  }
  if (/^\d+$/.test(t)) return Number(t);
  const d = Date.parse(t);
  return Number.isNaN(d) ? now : d;
}

/** A datetime-local input's value for ms. */
function localInput(ms) {
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60e3);
  return d.toISOString().slice(0, 19);
}

/** ms for a datetime-local input's value (local time). */
function fromLocalInput(v) {
  return new Date(v).getTime();
}

/** Fills the query bar from the state. */
export function syncQueryBar(s, types) {
  const sel = $("ptype");
  const opts = types.length ? types : s.type ? [s.type] : [];
  sel.innerHTML = opts.map((t) => `<option ${t === s.type ? "selected" : ""}>${esc(t)}</option>`).join("");
  if (document.activeElement !== $("selector")) $("selector").value = s.q === "{}" ? "" : s.q;
  const preset = /^now-(\w+)$/.exec(s.from);
  $("preset").value = preset && s.to === "now" && [...$("preset").options].some((o) => o.value === preset[1]) ? preset[1] : "";
  $("from").value = localInput(toMs(s.from));
  $("to").value = localInput(toMs(s.to));
  $("groupby").value = s.group;
  if (document.activeElement !== $("tenant")) $("tenant").value = s.tenant;
  if (document.activeElement !== $("bselector")) $("bselector").value = s.bq;
  $("bfrom").value = s.bfrom ? localInput(toMs(s.bfrom)) : "";
  $("bto").value = s.bto ? localInput(toMs(s.bto)) : "";
}

/** Wires the query bar's inputs to the state. */
export function initQueryBar() {
  $("ptype").onchange = (e) => setState({ type: e.target.value, zoom: "", focus: "" });
  $("preset").onchange = (e) => {
    if (e.target.value) setState({ from: "now-" + e.target.value, to: "now" });
  };
  const abs = () => setState({ from: String(fromLocalInput($("from").value)), to: String(fromLocalInput($("to").value)) });
  $("from").onchange = abs;
  $("to").onchange = abs;
  $("groupby").onchange = (e) => setState({ group: e.target.value.trim() });
  $("tenant").onchange = (e) => setState({ tenant: e.target.value.trim(), type: "" });
  $("run").onclick = () => setState({ q: $("selector").value.trim() || "{}" });
  $("bselector").onchange = (e) => setState({ bq: e.target.value.trim() });
  $("bfrom").onchange = (e) => setState({ bfrom: e.target.value ? String(fromLocalInput(e.target.value)) : "" });
  $("bto").onchange = (e) => setState({ bto: e.target.value ? String(fromLocalInput(e.target.value)) : "" });
  $("bsame").onclick = () => {
    const s = getState();
    const a = toMs(s.from);
    const b = toMs(s.to);
    setState({ from: String(a), to: String(b), bfrom: String(a - (b - a)), bto: String(a) });
  };
  initAutocomplete($("selector"), $("suggest"));
}

/**
 * What the cursor is completing in a selector `{a="x", b=~"y`: a label
 * name (after `{` or `,`) or the value of a label (inside quotes).
 */
export function completionContext(text, cursor) {
  const before = text.slice(0, cursor);
  const value = /([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)$/.exec(before);
  if (value) return { kind: "value", label: value[1], prefix: value[3], from: cursor - value[3].length };
  const name = /(?:^|[{,])\s*([A-Za-z_][A-Za-z0-9_]*)?$/.exec(before);
  if (name) {
    const prefix = name[1] || "";
    return { kind: "name", prefix, from: cursor - prefix.length };
  }
  return null;
}

function initAutocomplete(input, list) {
  let items = [];
  let active = -1;
  let ctx = null;
  const close = () => {
    list.hidden = true;
    active = -1;
  };
  const apply = (v) => {
    const text = input.value;
    const cur = input.selectionStart;
    let insert = ctx.kind === "name" ? v + '="' : v + '"';
    let after = text.slice(cur);
    if (ctx.kind === "value" && after.startsWith('"')) after = after.slice(1);
    let head = text.slice(0, ctx.from);
    if (!head.includes("{")) head = "{" + head;
    if (!after.includes("}")) after = after + "}";
    input.value = head + insert + after;
    const pos = (head + insert).length;
    input.setSelectionRange(pos, pos);
    close();
    input.focus();
    update();
  };
  const render = () => {
    list.innerHTML = items.map((v, k) => `<li class="${k === active ? "active" : ""}">${esc(v)}</li>`).join("");
    list.hidden = items.length === 0;
    [...list.children].forEach((li, k) => {
      li.onmousedown = (e) => {
        e.preventDefault();
        apply(items[k]);
      };
    });
  };
  let seq = 0;
  const update = async () => {
    ctx = completionContext(input.value, input.selectionStart);
    if (!ctx) return close();
    const s = getState();
    const my = ++seq;
    try {
      const params = { start: s.from, end: s.to, query: s.type ? s.type + "{}" : undefined };
      const r =
        ctx.kind === "name"
          ? (await getJson("/api/v1/labels", params)).labels
          : (await getJson(`/api/v1/label/${encodeURIComponent(ctx.label)}/values`, params)).values;
      if (my !== seq) return;
      items = r.filter((v) => v.startsWith(ctx.prefix)).slice(0, 50);
      active = items.length ? 0 : -1;
      render();
    } catch {
      close();
    }
  };
  input.addEventListener("input", update);
  input.addEventListener("focus", update);
  input.addEventListener("blur", () => setTimeout(close, 100));
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (list.hidden || active < 0)) {
      setState({ q: input.value.trim() || "{}" });
      close();
      return;
    }
    if (list.hidden) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      active = (active + (e.key === "ArrowDown" ? 1 : items.length - 1)) % items.length;
      render();
      e.preventDefault();
    } else if (e.key === "Enter" || e.key === "Tab") {
      apply(items[active]);
      e.preventDefault();
    } else if (e.key === "Escape") {
      close();
    }
  });
}
