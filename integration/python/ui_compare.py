"""The compare view on an injected regression, in headless Chromium.

Usage: ui_compare.py BASE TENANT PTYPE A_SELECTOR B_SELECTOR START_MS END_MS TARGET OUT

Opens the compare view of A against B and checks that the what-changed
table's first row is TARGET (the function made slower in B) and is marked
significant, that the diff icicle graph is drawn, and that the metrics graph
holds both sides; writes OUT/compare-regression.png.
"""

import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from selenium.webdriver.common.by import By  # noqa: E402

from ui_browser_common import driver, wait_chart, wait_view  # noqa: E402

BASE, TENANT, PTYPE, A_SEL, B_SEL, START, END, TARGET, OUT = sys.argv[1:10]


def main():
    state = {"tenant": TENANT, "type": PTYPE, "q": A_SEL, "bq": B_SEL, "from": START, "to": END, "view": "compare"}
    d = driver()
    try:
        d.get(BASE + "/?" + urllib.parse.urlencode(state))
        v = wait_view(d)
        if v.get("error"):
            raise AssertionError(f"the compare view shows an error: {v['error']}")
        first = d.find_element(By.CSS_SELECTOR, "#changes tbody tr")
        name = first.get_attribute("data-name")
        if name != TARGET or "sig" not in first.get_attribute("class").split():
            raise AssertionError(f"first row {name!r} ({first.get_attribute('class')!r}), expected {TARGET!r} marked significant")
        if v["nodes"] < 100 or v["drawn"] < 50:
            raise AssertionError(f"the diff icicle graph was not drawn: {v}")
        chart = wait_chart(d)
        if sorted({c["side"] for c in chart}) != ["A", "B"]:
            raise AssertionError(f"the metrics graph should hold A and B: {chart}")
        # A and B are two label sets over one range: one window, one label.
        if chart[0]["marks"] != ["A = B"]:
            raise AssertionError(f"the shared window should be marked once as 'A = B': {chart[0]['marks']}")
        os.makedirs(OUT, exist_ok=True)
        d.set_window_size(1400, 1400)
        time.sleep(0.2)
        d.save_screenshot(os.path.join(OUT, "compare-regression.png"))
        print(f"first row: {name} (significant)")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
