// Calls to the HTTP API (docs/api.md). Every request carries the tenant
// from the URL state as X-Scope-OrgID; an error answer becomes an Error
// with the server's message.

import { getState } from "./state.js";

function headers() {
  const t = getState().tenant.trim();
  return t ? { "X-Scope-OrgID": t } : {};
}

/** The URL of an API path with parameters. */
export function apiUrl(path, params = {}) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") p.set(k, v);
  }
  return path + (p.toString() ? "?" + p : "");
}

/** GETs `path` and parses the answer as JSON; throws with the API's message. */
export async function getJson(path, params) {
  const r = await fetchOk(path, params);
  return r.json();
}

/** GETs `path`; throws with the API's `{"error": …}` message on a non-2xx. */
export async function fetchOk(path, params) {
  const url = apiUrl(path, params);
  let r;
  try {
    // Against the origin, never the page's URL: a page opened as
    // http://user:password@host/ (a Basic login) may not fetch relative
    // URLs; the browser sends its stored credential to the origin.
    r = await fetch(new URL(url, location.origin), { headers: headers() });
  } catch (e) {
    throw new Error(`cannot reach the server (${e.message})`);
  }
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try {
      const body = await r.text();
      try {
        msg = JSON.parse(body).error || msg;
      } catch {
        if (body) msg = body.slice(0, 500);
      }
    } catch {
      // keep the status line
    }
    throw new Error(`${path}: ${msg}`);
  }
  return r;
}
