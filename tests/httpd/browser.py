"""Headless Chromium from Debian (`chromium`, `chromium-driver`) driven by Selenium, for tests of
ramen's dashboard page in a real browser.

Nothing is downloaded at run time: the driver's path is given, so selenium-manager never runs.
Tests that use `browser` are skipped, with the reason, only where Chromium or its driver is absent.

    from tests.httpd.browser import browser  # noqa: F401  (the fixture)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW_SIZE = (1400, 1000)
"""Wide enough for two charts one above the other and the picker beside them."""
WAIT_TIMEOUT_S = 60.0
"""A render runs a replay (workers starting, the merge delay): generous, as it is only an upper bound."""
POLL_S = 0.05


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing (Debian's {package}: apt-get install {package})"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator:
    """One headless Chromium for the module's tests; its console log kept under the tmp dir."""
    reason = chromium_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    log_dir = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                     f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}", f"--user-data-dir={log_dir / 'profile'}"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(log_dir / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_script_timeout(WAIT_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script: str, *args, timeout_s: float = WAIT_TIMEOUT_S, what: str = ""):
    """The first truthy value of the JavaScript expression `script` (a function body returning it),
    polled; on timeout, fails naming `what` and the page's console errors."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = driver.execute_script(script, *args)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or script}; "
                        f"console: {console_errors(driver)}")
        time.sleep(POLL_S)


def console_errors(driver) -> list[str]:
    try:
        return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    except Exception:  # noqa: BLE001  (a driver without logs: the failure's own message suffices)
        return []


def charts_settled(driver, renders: list[int] | None = None) -> list[dict]:
    """window.ramenCharts once no chart is rendering and chart i has rendered more than renders[i]
    times (so a test waits for the render it caused, not an older one)."""
    return wait_for(driver, """
        const before = arguments[0];
        const charts = window.ramenCharts || [];
        if (!charts.length || charts.some((c) => c.state === 'loading')) return null;
        if (before && charts.some((c, i) => c.renders <= (before[i] ?? -1))) return null;
        return JSON.parse(JSON.stringify(charts));
    """, renders, what="every chart's render")


def render_counts(driver) -> list[int]:
    return driver.execute_script("return (window.ramenCharts || []).map((c) => c.renders);")


def save_screenshot(driver, path: Path) -> Path:
    """The page as it looks, kept as the test's artefact; its path printed for the test's output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


__all__ = ["CHROMEDRIVER", "CHROMIUM", "browser", "charts_settled", "chromium_missing", "console_errors",
           "render_counts", "save_screenshot", "wait_for"]
