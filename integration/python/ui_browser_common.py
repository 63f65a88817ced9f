"""Headless Chromium for the UI test and benchmark (selenium)."""

import os
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def driver():
    """Headless Chromium at 1400×1000 (CHROMIUM, CHROMEDRIVER override the paths)."""
    opts = Options()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"]:
        opts.add_argument(a)
    svc = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=svc)


def banner(d):
    """The error banner's text, or "" when hidden."""
    e = d.find_element(By.ID, "error")
    return "" if not e.is_displayed() else e.text


def wait_chart(d, timeout=60):
    """Waits until the metrics graph is drawn (it renders beside the view,
    not before it); returns window.fathomChart."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        c = d.execute_script("return window.fathomChart")
        if c is not None:
            return c
        time.sleep(0.05)
    raise AssertionError(f"the metrics graph was not drawn in {timeout}s; error banner: {banner(d)!r}")


def wait_view(d, timeout=60):
    """Waits until the page has rendered its view; returns window.fathomView."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = d.execute_script("return window.fathomView")
        if v and v.get("ready"):
            return v
        time.sleep(0.05)
    raise AssertionError(f"the view did not render in {timeout}s; error banner: {banner(d)!r}")
