"""End-to-end test of the web UI in headless Chromium against a running
`fathom all` that holds profiles (ingested by integration/tests/e2e/ui.rs).

Every view is loaded in a real browser and compared with the HTTP API's
answer for the same selection; zoom, search, compare and a reload must
restore the same view. A screenshot of each view is written to OUT_DIR.

usage: ui_browser.py BASE_URL TENANT START_MS END_MS OUT_DIR

Prints one JSON line of timings at the end. Exits non-zero (with the reason)
on any mismatch.
"""

import json
import os
import sys
import time
import re
import subprocess
import urllib.parse
import urllib.request

from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

sys.path.insert(0, os.path.dirname(__file__))
from ui_browser_common import banner, driver, wait_chart, wait_view  # noqa: E402

BASE, TENANT, START, END, OUT = sys.argv[1:6]
PTYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
SVC = '{service_name="kafka"}'


def api(path, **params):
    """GET an API path as the tenant; the parsed JSON answer."""
    url = BASE + path + "?" + urllib.parse.urlencode(params)
    req = urllib.request.Request(url, headers={"X-Scope-OrgID": TENANT})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def page(**state):
    """The UI's URL for a state."""
    return BASE + "/?" + urllib.parse.urlencode(state)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def shot(d, name):
    """Screenshot of the whole page (up to 1,800 px tall) as OUT/name.png."""
    os.makedirs(OUT, exist_ok=True)
    h = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(1400, max(1000, min(h, 1800)))
    time.sleep(0.2)
    d.save_screenshot(os.path.join(OUT, name + ".png"))
    d.set_window_size(1400, 1000)
    time.sleep(0.1)


def widest_from_api(tree, n=5):
    kids = sorted(tree["children"], key=lambda c: (-c["value"], c["name"]))
    return [(c["name"], c["value"]) for c in kids[:n]]


def outermost_matches(tree, rx):
    """The value of every outermost frame matching rx (as the UI counts)."""
    total = 0
    stack = list(tree["children"])
    while stack:
        n = stack.pop()
        if rx.search(n["name"]):
            total += n["value"]
        else:
            stack.extend(n["children"])
    return total


def main():
    base_state = dict(tenant=TENANT, type=PTYPE, q=SVC, **{"from": START, "to": END})
    timings = {}
    d = driver()
    try:
        # 1. Empty state: a tenant with no data says how to send some.
        d.get(page(tenant="nobody-here", **{"from": START, "to": END}))
        v = wait_view(d)
        check(v["view"] == "empty", f"expected the empty state, got {v}")
        text = d.find_element(By.ID, "main").text
        for want in ["fathom agent", "curl", "/ingest", "SDK"]:
            check(want in text, f"empty state lacks {want!r}: {text}")
        shot(d, "empty")
        # The folded-stacks command shown works as pasted: run it, and the
        # page shows its data.
        cmd = next(p.text for p in d.find_elements(By.CSS_SELECTOR, "#empty pre") if "printf" in p.text)
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        check(out.returncode == 0 and '"profiles":1' in out.stdout, f"the shown command failed: {cmd}\n{out.stdout}{out.stderr}")
        d.get(page(tenant="nobody-here"))
        v = wait_view(d)
        check(v["view"] == "icicle" and [w["name"] for w in v["widest"]] == ["main"], f"after the shown ingest: {v}")

        # 2. Error state: a bad selector shows the API's message.
        d.get(page(**{**base_state, "q": '{service_name="kafka"'}))
        v = wait_view(d)
        msg = banner(d)
        check(v.get("error") and msg, f"expected an error banner, got {v}")
        check(": query: " in msg, f"the banner should carry the API's message naming the parameter: {msg}")
        shot(d, "error")

        # 3. Icicle: widest frames equal the API's flame graph.
        tree = api("/api/v1/query", query=PTYPE + SVC, start=START, end=END, format="flamegraph", max_nodes=50000)
        t0 = time.time()
        d.get(page(**base_state))
        v = wait_view(d)
        timings["icicle_load_s"] = round(time.time() - t0, 3)
        timings["icicle_first_paint_ms"] = round(d.execute_script("return window.fathomTimings.firstPaint"), 1)
        check(v["view"] == "icicle", f"icicle view expected: {v}")
        got = [(w["name"], w["value"]) for w in v["widest"][:5]]
        want = widest_from_api(tree)
        check(got == want, f"widest frames differ:\n page {got}\n api  {want}")
        check(v["zoomValue"] == tree["value"], f"root {v['zoomValue']} != api total {tree['value']}")
        shot(d, "icicle")

        # 3b. Metrics graph: group by a label gives one line per value;
        # dragging across it selects the range the views merge.
        d.get(page(**base_state, group="version"))
        wait_view(d)
        wait_chart(d)
        legend = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#legend span")]
        check(legend == ["version=1.0", "version=1.1"], f"group-by legend: {legend}")
        r = d.execute_script("const r = document.getElementById('chart').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]")
        # The plot spans [64, width - 12] px; profiles are at +600 s .. +780 s of 1,500 s.
        span = r[2] - 76
        x0 = r[0] + 64 + span * 0.3
        x1 = r[0] + 64 + span * 0.45
        pointer = ActionBuilder(d)
        pointer.pointer_action.move_to_location(int(x0), int(r[1] + r[3] / 2)).pointer_down()
        pointer.pointer_action.move_to_location(int((x0 + x1) / 2), int(r[1] + r[3] / 2))
        pointer.pointer_action.move_to_location(int(x1), int(r[1] + r[3] / 2)).pointer_up()
        pointer.perform()
        time.sleep(0.3)
        v = wait_view(d)
        q = urllib.parse.parse_qs(urllib.parse.urlparse(d.current_url).query)
        f0, f1 = int(q["from"][0]), int(q["to"][0])
        check(int(START) < f0 < f1 < int(END), f"drag did not select a range: {d.current_url}")
        sel = api("/api/v1/query", query=PTYPE + SVC, start=f0, end=f1, format="flamegraph", max_nodes=50000)
        check(v["zoomValue"] == sel["value"] and sel["value"] < tree["value"],
              f"after the drag the graph shows {v['zoomValue']}, the API {sel['value']} (all: {tree['value']})")

        # 4. Zoom: click the widest child; the URL records it; reload restores it.
        d.get(page(**base_state))
        wait_view(d)
        rows = d.execute_script("return window.fathomIcicle.rows[1]")
        target = want[0][0]
        x = None
        for k in range(0, len(rows), 3):
            if d.execute_script("return window.fathomIcicle.f.name[arguments[0]]", rows[k]) == target:
                x = rows[k + 1] + rows[k + 2] / 2
                break
        check(x is not None, f"{target} is not drawn on row 1")
        # A real pointer at viewport coordinates (the canvas can be taller
        # than the window, so element-relative offsets are ambiguous).
        top, left = d.execute_script(
            "const r = document.querySelector('canvas.icicle').getBoundingClientRect(); return [r.top, r.left]")
        pointer = ActionBuilder(d)
        pointer.pointer_action.move_to_location(int(left + x), int(top + 18 * 1.5))
        pointer.perform()
        time.sleep(0.1)
        tip = d.find_element(By.ID, "tooltip")
        check(tip.is_displayed() and target[:20] in tip.text and "self" in tip.text, f"tooltip missing or wrong: {tip.text!r}")
        pointer = ActionBuilder(d)
        pointer.pointer_action.click()
        pointer.perform()
        time.sleep(0.2)
        v = wait_view(d)
        check(v["zoomName"] == target, f"zoom: expected {target}, got {v['zoomName']}")
        zoomed = dict(v)
        timings["zoom_draw_ms"] = round(v["drawMs"], 2)
        check("zoom=" in d.current_url, f"the zoom is not in the URL: {d.current_url}")
        shot(d, "zoom")
        d.refresh()
        v = wait_view(d)
        check(v["zoomPath"] == zoomed["zoomPath"] and v["widest"] == zoomed["widest"], f"reload lost the zoom: {v}")
        crumbs = d.find_elements(By.CSS_SELECTOR, "#breadcrumb a")
        check(len(crumbs) == 2, f"breadcrumb: {[c.text for c in crumbs]}")
        crumbs[0].click()
        v = wait_view(d)
        check(v["zoomName"] == "total", f"breadcrumb did not zoom out: {v}")

        # 5. Search: highlights and reports the matching share; survives reload.
        term = "kafka"
        box = d.find_element(By.ID, "search")
        box.clear()
        box.send_keys(term + Keys.ENTER)
        time.sleep(0.2)
        v = wait_view(d)
        want_total = outermost_matches(tree, re.compile(term, re.I))
        check(want_total > 0, "the search term matches nothing in the API's tree")
        check(v["searchTotal"] == want_total, f"search total {v['searchTotal']} != {want_total}")
        share = d.find_element(By.ID, "searchshare").text
        check("%" in share, f"no share shown: {share!r}")
        shot(d, "search")
        d.refresh()
        v = wait_view(d)
        check(v["searchTotal"] == want_total, f"reload lost the search: {v}")

        # 6. Top table: first rows equal the API's; a click focuses the icicle.
        top = api("/api/v1/query", query=PTYPE + SVC, start=START, end=END, format="top")
        d.get(page(**base_state, view="top"))
        v = wait_view(d)
        cells = [r.find_elements(By.TAG_NAME, "td") for r in d.find_elements(By.CSS_SELECTOR, "#toptable tbody tr")[:5]]
        got = [c[0].text for c in cells]
        want = [r["name"] for r in top["rows"][:5]]
        check(got == want, f"top rows differ:\n page {got}\n api  {want}")
        check(v["rows"] == len(top["rows"]), f"row count {v['rows']} != {len(top['rows'])}")
        shot(d, "top")
        # Sort by cum, then filter.
        d.find_element(By.CSS_SELECTOR, 'th[data-sort="cum"]').click()
        wait_view(d)
        first = d.find_element(By.CSS_SELECTOR, "#toptable tbody tr td.fn").text
        best_cum = max(r["cum"] for r in top["rows"])
        first_cum = next(r for r in top["rows"] if r["name"] == first)["cum"]
        check(first_cum == best_cum, f"sorted by cum, first row {first} has cum {first_cum}, max is {best_cum}")
        d.find_elements(By.CSS_SELECTOR, "#toptable tbody tr")[0].click()
        v = wait_view(d)
        check(v["view"] == "icicle" and v["zoomName"] == first, f"row click did not focus {first}: {v}")

        # 6b. Filter box: only matching functions, all of them.
        d.get(page(**base_state, view="top"))
        wait_view(d)
        box = d.find_element(By.ID, "filter")
        box.send_keys("hashmap" + Keys.ENTER)
        time.sleep(0.2)
        wait_view(d)
        names = [td.text for td in d.find_elements(By.CSS_SELECTOR, "#toptable tbody td.fn")]
        want = [r["name"] for r in top["rows"] if "hashmap" in r["name"].lower()]
        check(names and sorted(names) == sorted(want), f"filter: {names[:5]}… vs {want[:5]}…")
        check("filter=hashmap" in d.current_url, f"the filter is not in the URL: {d.current_url}")

        # 7. Sandwich of the top function: callees total = its cum.
        fn = top["rows"][0]["name"]
        d.get(page(**base_state, view="sandwich", fn=fn))
        v = wait_view(d)
        cum = top["rows"][0]["cum"]
        check(v["callees"] == cum and v["callers"] == cum, f"sandwich {v} vs cum {cum}")
        shot(d, "sandwich")

        # 8. Compare two label sets: the what-changed table equals /api/v1/changes.
        a_sel = '{service_name="kafka", version="1.0"}'
        b_sel = '{service_name="kafka", version="1.1"}'
        ch = api("/api/v1/changes", left=PTYPE + a_sel, right=PTYPE + b_sel, left_start=START, left_end=END,
                 right_start=START, right_end=END, limit=200)
        d.get(page(**{**base_state, "q": a_sel}, view="compare", bq=b_sel))
        v = wait_view(d)
        check(v["view"] == "compare", f"compare view expected: {v}")
        got = [c["name"] for c in v["changes"][:10]]
        want = [c["name"] for c in ch["changes"][:10]]
        check(got == want, f"changes differ:\n page {got}\n api  {want}")
        rows = d.find_elements(By.CSS_SELECTOR, "#changes tbody tr")
        check(len(rows) == len(ch["changes"]), f"{len(rows)} rows vs {len(ch['changes'])}")
        # The metrics graph holds both sides, each with its own profiles.
        chart = wait_chart(d)
        check([c["side"] for c in chart] == ["A", "B"] and all(c["points"] > 0 for c in chart),
              f"compare graph should have a series for A and one for B: {chart}")
        legend = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#legend span")]
        check(legend[0].startswith("A: ") and legend[1].startswith("B: "), f"compare legend: {legend}")
        shot(d, "compare")
        d.refresh()
        v2 = wait_view(d)
        check(v2["changes"] == v["changes"] and v2["widest"] == v["widest"], "reload changed the compare view")

        # 8b. Compare two time ranges of the same selector.
        a_to = str(int(START) + 690_000)  # the first two profiles (version 1.0)
        b_from = str(int(START) + 700_000)
        ch = api("/api/v1/changes", left=PTYPE + SVC, right=PTYPE + SVC, left_start=START, left_end=a_to,
                 right_start=b_from, right_end=END, limit=200)
        check(ch["left"]["profiles"] == 2 and ch["right"]["profiles"] == 2, f"time split: {ch['left']} {ch['right']}")
        d.get(page(**{**base_state, "to": a_to}, view="compare", bfrom=b_from, bto=END))
        v = wait_view(d)
        got = [c["name"] for c in v["changes"][:10]]
        want = [c["name"] for c in ch["changes"][:10]]
        check(got == want, f"time-range changes differ:\n page {got}\n api  {want}")
        # Two windows of one selector: each side's line stays inside its own
        # window (two profiles each).
        chart = wait_chart(d)
        check([(c["side"], c["points"]) for c in chart] == [("A", 2), ("B", 2)],
              f"time-split compare graph: {chart}")

        # 8c. Download pprof: the button fetches a gzip'd pprof of the view.
        d.get(page(**base_state))
        wait_view(d)
        d.execute_script("""window.__dl = null; const orig = URL.createObjectURL;
            URL.createObjectURL = (b) => { window.__dl = b; return orig.call(URL, b); };""")
        d.find_element(By.ID, "download").click()
        head = d.execute_async_script("""const done = arguments[0];
            const poll = () => window.__dl ? window.__dl.arrayBuffer().then((b) =>
              done([b.byteLength, ...new Uint8Array(b.slice(0, 2))])) : setTimeout(poll, 50);
            poll();""")
        check(head[0] > 1000 and head[1:] == [0x1F, 0x8B], f"download is not a gzip'd pprof: {head}")
        # Copy link: copied, or shown selected when the clipboard is refused.
        d.find_element(By.ID, "copylink").click()
        time.sleep(0.2)
        box = d.find_element(By.ID, "linkbox")
        copied = d.find_element(By.ID, "copylink").text == "Copied"
        check(copied or box.get_attribute("value") == d.current_url, "copy link did nothing")

        # 9. Tenant field: typing a tenant switches the data source.
        d.get(page(**{"from": START, "to": END}))
        wait_view(d)
        t = d.find_element(By.ID, "tenant")
        t.clear()
        t.send_keys(TENANT + Keys.ENTER)
        time.sleep(0.3)
        v = wait_view(d)
        check(v["view"] == "icicle" and f"tenant={TENANT}" in d.current_url, f"tenant field: {v} {d.current_url}")

        # 10. Autocompletion of label names, then values.
        sel = d.find_element(By.ID, "selector")
        sel.clear()
        sel.send_keys("{vers")
        time.sleep(0.5)
        items = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#suggest li")]
        check(items == ["version"], f"label name suggestions: {items}")
        sel.send_keys(Keys.TAB)
        time.sleep(0.5)
        items = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#suggest li")]
        check(items == ["1.0", "1.1"], f"label value suggestions: {items}")
        shot(d, "autocomplete")
    finally:
        d.quit()
    print(json.dumps(timings))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
