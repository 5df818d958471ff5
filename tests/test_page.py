"""The try-it page in a real headless Chromium: upload a real photo, see the class, compare backends.

Needs Debian's `chromium` and `chromium-driver`. The screenshot is kept in build/test-artifacts/.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.conftest import DEFAULT_MODEL, ROOT, Service

ARTIFACTS = ROOT / "build" / "test-artifacts"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# The machine's closed network: no first-run, sync, update or QUIC traffic to wait on.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,900")
WAIT_S = 60


@pytest.fixture(scope="module")
def two_backends():
    """The service on cpu and emulated, so the page can compare them."""
    svc = Service({"EDGETPU_SERVE_MODELS": DEFAULT_MODEL, "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
                   "EDGETPU_SERVE_WORKERS": "1"})
    svc.wait_ready()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=DriverService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def cards(driver) -> dict[str, list[str]]:
    """backend -> the labels its card shows, best first (read in one script: the page may redraw between calls)."""
    return driver.execute_script("""
        const out = {};
        for (const card of document.querySelectorAll("#results .card"))
            out[card.dataset.backend] = [...card.querySelectorAll(".pred .label")].map((e) => e.textContent);
        return out;""")


def test_upload_classify_and_compare_backends(two_backends, browser, cat_png):
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(two_backends.url + "/")
    wait.until(lambda d: len(Select(d.find_element(By.ID, "backend")).options) == 2)
    assert "Edge TPUs: none" in browser.find_element(By.ID, "devices").text

    browser.find_element(By.ID, "file").send_keys(str(cat_png))
    wait.until(ec.element_to_be_clickable((By.ID, "classify"))).click()
    wait.until(lambda d: cards(d).get("cpu"))
    assert cards(browser)["cpu"][0] == "tiger cat"
    timings = browser.find_element(By.CSS_SELECTOR, "#results .card table.timing").text
    assert all(stage in timings for stage in ("decode", "preprocess", "inference", "total"))

    browser.find_element(By.ID, "compare").click()
    wait.until(lambda d: set(cards(d)) == {"cpu", "emulated"})
    shown = cards(browser)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "try-it-page.png"))
    for backend, labels in shown.items():  # the page shows what the API answers
        api = httpx.post(f"{two_backends.url}/v1/classify?backend={backend}&top_k=5", content=cat_png.read_bytes(),
                         timeout=60).json()
        assert labels == [p["label"] for p in api["predictions"]]
    assert shown["cpu"][0] == "tiger cat"
