"""The web UI with authentication on, in headless Chromium: without a
credential the page is refused with a Basic challenge (Chromium stops at
its login prompt, showing nothing); with the user and password given to the browser (in the URL,
as a login prompt would), the page and every API call it makes carry them
and the flame graph renders the credential's tenant's data.

usage: ui_auth.py BASE_URL USER PASSWORD SERVICE

Prints the rendered view as JSON. Exits non-zero (with the reason) on any
mismatch.
"""

import json
import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from ui_browser_common import banner, driver, wait_view  # noqa: E402

BASE, USER, PASSWORD, SERVICE = sys.argv[1:5]
PTYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def main():
    d = driver()
    try:
        d.get(BASE + "/")
        # Chromium waits at its login prompt: no page, no UI.
        if d.execute_script("return window.fathomView !== undefined || document.body.innerText.length > 0"):
            raise AssertionError(f"without a credential the UI must not load: {d.page_source[:400]}")
        scheme, host = BASE.split("://", 1)
        state = urllib.parse.urlencode({"type": PTYPE, "q": '{service_name="%s"}' % SERVICE, "from": int((time.time() - 3600) * 1000), "to": int(time.time() * 1000)})
        login = f"{scheme}://{urllib.parse.quote(USER)}:{urllib.parse.quote(PASSWORD)}@{host}/?{state}"
        d.get(login)
        v = wait_view(d)
        if banner(d):
            raise AssertionError(f"error banner with a credential: {banner(d)!r}")
        if v.get("view") != "icicle" or not v.get("widest"):
            raise AssertionError(f"expected the flame graph of {SERVICE}, got {v}")
        # The page's own API calls are authenticated (same origin, the
        # browser's stored credential): a fetch from the page succeeds.
        status = d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(new URL('/api/v1/series?start=now-1h', location.origin)).then(r => done(r.status), e => done(String(e)));"
        )
        if status != 200:
            raise AssertionError(f"a fetch from the page got {status}")
        print(json.dumps(v))
    finally:
        d.quit()


main()
