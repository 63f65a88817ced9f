// The compare view: a diff icicle graph of A against B, coloured by the
// relative change of each frame's share, and the "what changed" table from
// /api/v1/changes (functions ranked by the change of their share, with a
// Mann–Whitney significance per function).

import { formatValue, points, esc } from "./format.js";
import { setState } from "./state.js";

/** Renders the what-changed table of a /api/v1/changes answer. */
export function renderChanges(host, data) {
  const u = data.unit;
  const rows = data.changes;
  host.innerHTML = `<h3>What changed <span class="muted">— ${data.significant} of ${data.functions} functions significant
    (q &lt; ${data.alpha}); A: ${data.left.observations} observations of ${data.left.profiles} profiles,
    B: ${data.right.observations} of ${data.right.profiles}</span></h3>
    <table id="changes"><thead><tr><th>#</th><th>Function</th><th class="num">A self</th><th class="num">B self</th>
    <th class="num">A share</th><th class="num">B share</th><th class="num">Change</th><th class="num">q</th><th>Significant</th></tr></thead>
    <tbody>${rows
      .map(
        (c, k) => `<tr data-name="${esc(c.name)}" class="${c.significant ? "sig" : ""} ${c.delta_share > 0 ? "up" : "down"}">
        <td>${k + 1}</td><td class="fn">${esc(c.name)}</td>
        <td class="num">${formatValue(c.a_flat, u)}</td><td class="num">${formatValue(c.b_flat, u)}</td>
        <td class="num">${(100 * c.a_share).toFixed(2)} %</td><td class="num">${(100 * c.b_share).toFixed(2)} %</td>
        <td class="num delta">${points(c.delta_share)}</td><td class="num">${c.q_value < 1e-4 ? c.q_value.toExponential(1) : c.q_value.toFixed(4)}</td>
        <td>${c.significant ? "yes" : "no"}</td></tr>`,
      )
      .join("")}</tbody></table>`;
  host.querySelectorAll("tbody tr").forEach((tr) => {
    tr.onclick = () => setState({ search: "^" + tr.dataset.name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$" });
  });
}
