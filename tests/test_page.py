"""The try-it page in a real headless Chromium: upload a real photo, see the class, compare backends,
and see where each request's time went as stacked bars on one scale; with a detection model, the boxes
and their labels drawn on the photo where the API puts them; with a segmentation model, the mask over the
photo covering what the API says, with its legend; with a pose model, the skeleton's joints where the API
puts the keypoints.

Needs Debian's `chromium` and `chromium-driver`. The screenshot goes to the test's tmp dir; with
TRY_IT_SCREENSHOT=PATH set it is also copied there (the docs' docs/img/try-it.png is made so:
`TRY_IT_SCREENSHOT=docs/img/try-it.png pytest tests/test_page.py`).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import httpx
import numpy as np
import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.conftest import DEFAULT_MODEL, ROOT, Service

STAGES = ("decode", "preprocess", "queue", "inference", "postprocess")  # the response's timing_ms keys, in order
PIXEL_TOLERANCE = 1.5  # a segment's width is rounded to device pixels
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


def stage_bars(driver) -> dict:
    """The stage chart as drawn: its scale, and per backend the track's width and each segment's
    stage, ms and rendered width (one script: the page may redraw between calls)."""
    return driver.execute_script("""
        const chart = document.getElementById("stages");
        if (!chart) return null;
        const rows = {};
        for (const row of chart.querySelectorAll(".stage-row[data-backend]")) {
            const track = row.querySelector(".track");
            rows[row.dataset.backend] = {
                track: track.getBoundingClientRect().width,
                segments: [...track.querySelectorAll(".seg")].map((s) => ({
                    stage: s.dataset.stage, ms: parseFloat(s.dataset.ms), width: s.getBoundingClientRect().width})),
                sum: row.querySelector(".sum").textContent};
        }
        return {scale: parseFloat(chart.dataset.scale), rows: rows,
                legend: [...chart.querySelectorAll(".legend li")].map((e) => e.textContent)};""")


def timing_tables(driver) -> dict[str, dict[str, float]]:
    """backend -> the timing table its card shows, ms."""
    return driver.execute_script("""
        const out = {};
        for (const card of document.querySelectorAll("#results .card")) {
            out[card.dataset.backend] = {};
            for (const tr of card.querySelectorAll("table.timing tr"))
                out[card.dataset.backend][tr.cells[0].textContent] = parseFloat(tr.cells[1].textContent);
        }
        return out;""")


def test_upload_classify_and_compare_backends(two_backends, browser, cat_png, tmp_path):
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(two_backends.url + "/")
    wait.until(lambda d: len(Select(d.find_element(By.ID, "backend")).options) == 2)
    assert "Edge TPUs: none" in browser.find_element(By.ID, "devices").text
    about = browser.find_element(By.ID, "about").text  # where the model came from, as /v1/models says
    assert "built here" in about and "licence: Apache-2.0" in about

    browser.find_element(By.ID, "file").send_keys(str(cat_png))
    wait.until(ec.element_to_be_clickable((By.ID, "classify"))).click()
    wait.until(lambda d: cards(d).get("cpu"))
    assert cards(browser)["cpu"][0] == "tiger cat"
    timings = browser.find_element(By.CSS_SELECTOR, "#results .card table.timing").text
    assert all(stage in timings for stage in ("decode", "preprocess", "inference", "total"))
    assert list(stage_bars(browser)["rows"]) == ["cpu"]  # one response, one bar

    browser.find_element(By.ID, "compare").click()
    wait.until(lambda d: set(cards(d)) == {"cpu", "emulated"})
    shown = cards(browser)
    for backend, labels in shown.items():  # the page shows what the API answers
        api = httpx.post(f"{two_backends.url}/v1/classify?backend={backend}&top_k=5", content=cat_png.read_bytes(),
                         timeout=60).json()
        assert labels == [p["label"] for p in api["predictions"]]
    assert shown["cpu"][0] == "tiger cat"

    # the stages of each response as a stacked bar, both backends on one scale
    wait.until(lambda d: (bars := stage_bars(d)) and set(bars["rows"]) == {"cpu", "emulated"})
    bars, tables = stage_bars(browser), timing_tables(browser)
    assert bars["legend"] == list(STAGES)
    longest = max(sum(seg["ms"] for seg in row["segments"]) for row in bars["rows"].values())
    assert longest <= bars["scale"] < longest * 2.5  # the scale holds the longest bar and is not much longer
    for backend, row in bars["rows"].items():
        assert [seg["stage"] for seg in row["segments"]] == list(STAGES)
        px_per_ms = row["track"] / bars["scale"]  # one scale: every bar's tracks are equally wide
        assert row["track"] == pytest.approx(bars["rows"]["cpu"]["track"], abs=0.5)
        for seg in row["segments"]:
            # the bar draws what the response said (the card's table shows it to 0.01 ms) ...
            assert seg["ms"] == pytest.approx(tables[backend][seg["stage"]], abs=0.006), (backend, seg)
            # ... with a width proportional to it
            assert seg["width"] == pytest.approx(seg["ms"] * px_per_ms, abs=PIXEL_TOLERANCE), (backend, seg)
        assert row["sum"].endswith(" ms")

    screenshot = tmp_path / "try-it.png"
    browser.save_screenshot(str(screenshot))
    image = np.asarray(Image.open(screenshot).convert("RGB"))
    assert image.shape[1] >= 1000 and image.shape[0] >= 600
    colours = {tuple(c) for c in image.reshape(-1, 3)[::7]}
    assert (0x00, 0x9E, 0x73) in colours  # the inference colour is on the screen: the bars rendered
    if target := os.environ.get("TRY_IT_SCREENSHOT"):
        shutil.copyfile(screenshot, ROOT / target)


@pytest.fixture(scope="module")
def detector_service():
    """The service with the person detector alone: the page opens on it (no classifier to default to)."""
    svc = Service({"EDGETPU_SERVE_MODELS": "ssdlite_mobilenet_v2_person", "EDGETPU_SERVE_BACKENDS": "cpu",
                   "EDGETPU_SERVE_WORKERS": "1"})
    svc.wait_ready()
    yield svc
    svc.stop()


def drawn_boxes(driver) -> list[dict] | None:
    """backend cpu's canvas: its size, its scale, the boxes drawn (canvas pixels) and the colour at each box's
    left edge, half-way down (one script: the page may redraw between calls)."""
    return driver.execute_script("""
        const canvas = document.querySelector('#results .card[data-backend="cpu"] canvas.boxes');
        if (!canvas) return null;
        const ctx = canvas.getContext("2d");
        const drawn = JSON.parse(canvas.dataset.drawn);
        for (const box of drawn)
            box.edge = [...ctx.getImageData(Math.round(box.x), Math.round(box.y + box.h / 2), 1, 1).data];
        return {width: canvas.width, height: canvas.height, scale: parseFloat(canvas.dataset.scale), boxes: drawn,
                labels: [...document.querySelectorAll('#results .card .pred .label')].map((e) => e.textContent)};""")


def test_a_detector_draws_its_boxes_and_labels_on_the_photo(detector_service, browser, tmp_path):
    from converter.photos import people_photos

    photo = next(p for p in people_photos() if p.name == "basketball1.png")
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(detector_service.url + "/")
    wait.until(lambda d: len(Select(d.find_element(By.ID, "backend")).options) == 1)
    assert browser.find_element(By.ID, "classify").text == "Detect"
    assert browser.find_element(By.ID, "minscore").is_displayed() and not browser.find_element(By.ID, "topk").is_displayed()
    browser.find_element(By.ID, "file").send_keys(str(photo))
    wait.until(ec.element_to_be_clickable((By.ID, "classify"))).click()
    wait.until(lambda d: drawn_boxes(d))
    shown = drawn_boxes(browser)
    api = httpx.post(f"{detector_service.url}/v1/detect?min_score=0.5", content=photo.read_bytes(), timeout=60).json()
    assert (shown["width"], shown["height"]) == (480, 360)  # 640 x 480, drawn 480 wide
    assert shown["scale"] == pytest.approx(480 / 640)
    assert shown["labels"] == [d["label"] for d in api["detections"]] == ["person", "person"]
    for box, d in zip(shown["boxes"], api["detections"]):  # drawn where the API says, on the canvas' scale
        assert box["label"] == d["label"]
        left, top = d["box"]["x_min"] * shown["scale"], d["box"]["y_min"] * shown["scale"]
        right, bottom = d["box"]["x_max"] * shown["scale"], d["box"]["y_max"] * shown["scale"]
        assert abs(box["x"] - left) <= 0.5 and abs(box["y"] - top) <= 0.5  # on the nearest whole canvas pixel
        assert abs(box["x"] + box["w"] - right) <= 0.5 and abs(box["y"] + box["h"] - bottom) <= 0.5
        red, green, blue, _ = box["edge"]
        assert red > 150 and green < 140 and blue < 80, box  # the box's colour (#D55E00) on a grey photo
    screenshot = tmp_path / "try-it-detect.png"
    browser.save_screenshot(str(screenshot))
    colours = {tuple(c) for c in np.asarray(Image.open(screenshot).convert("RGB")).reshape(-1, 3)[::3]}
    assert (0xD5, 0x5E, 0x00) in colours  # the boxes and their label tags are on the screen
    if target := os.environ.get("TRY_IT_DETECT_SCREENSHOT"):
        shutil.copyfile(screenshot, ROOT / target)


@pytest.fixture(scope="module")
def segpose_service(tmp_path_factory):
    """The service with a segmenter and a pose model (tests/segmentation_models.py tiny_segmenter, tests/pose_models.py
    tiny_pose: flatbuffers, no TensorFlow), imported as Coral's files are."""
    from converter.importer import ImportOptions, import_model
    from tests.pose_models import tiny_pose
    from tests.segmentation_models import LABELS, tiny_segmenter

    work = tmp_path_factory.mktemp("segpose")
    (work / "segmenter.tflite").write_bytes(tiny_segmenter())
    (work / "labels.txt").write_text("\n".join(LABELS) + "\n")
    import_model([work / "segmenter.tflite"], ImportOptions(name="shapes", out=work / "models",
                                                            labels=work / "labels.txt"))
    (work / "pose.tflite").write_bytes(tiny_pose())
    import_model([work / "pose.tflite"], ImportOptions(name="figure", out=work / "models"))
    svc = Service({"EDGETPU_SERVE_MODEL_DIR": str(work / "models"), "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
                   "EDGETPU_SERVE_WORKERS": "1"}, inherit_settings=False)
    svc.wait_ready()
    yield svc
    svc.stop()


def drawn_overlay(driver) -> dict | None:
    """backend cpu's canvas: its size and scale, the mask's canvas pixels per class id, the legend, the joints drawn
    (one script: the page may redraw between calls)."""
    return driver.execute_script("""
        const canvas = document.querySelector('#results .card[data-backend="cpu"] canvas.boxes');
        if (!canvas) return null;
        return {width: canvas.width, height: canvas.height, scale: parseFloat(canvas.dataset.scale),
                classes: canvas.dataset.classes ? JSON.parse(canvas.dataset.classes) : null,
                joints: canvas.dataset.drawn ? JSON.parse(canvas.dataset.drawn) : null,
                legend: [...document.querySelectorAll('#results .card[data-backend="cpu"] .mask-legend li')]
                    .map((e) => [parseInt(e.dataset.classId, 10), e.textContent])};""")


def choose(driver, wait, model: str) -> None:
    wait.until(lambda d: model in [o.get_attribute("value") for o in Select(d.find_element(By.ID, "model")).options])
    Select(driver.find_element(By.ID, "model")).select_by_value(model)


def test_a_segmenter_overlays_its_mask_with_a_legend(segpose_service, browser, tmp_path):
    from tests.segmentation_models import shapes_image

    photo = tmp_path / "shapes.png"
    Image.fromarray(shapes_image(640, 400, {1: (40, 40, 360, 300), 2: (420, 100, 600, 380)})).save(photo)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(segpose_service.url + "/")
    choose(browser, wait, "shapes")
    assert browser.find_element(By.ID, "classify").text == "Segment"
    browser.find_element(By.ID, "file").send_keys(str(photo))
    wait.until(ec.element_to_be_clickable((By.ID, "classify"))).click()
    wait.until(lambda d: (drawn_overlay(d) or {}).get("classes"))
    shown = drawn_overlay(browser)
    api = httpx.post(f"{segpose_service.url}/v1/models/shapes/segment?backend=cpu", content=photo.read_bytes(),
                     timeout=60).json()
    assert (shown["width"], shown["height"]) == (480, 300) and shown["scale"] == pytest.approx(480 / 640)
    assert [c[0] for c in shown["legend"]] == [c["class_id"] for c in api["classes"]] == [0, 1, 2]
    assert [c[1].split(" ")[0] for c in shown["legend"]] == ["background", "red", "green"]
    total = shown["width"] * shown["height"]
    for c in api["classes"]:  # the mask drawn over the photo covers what the API says, class by class
        assert shown["classes"][str(c["class_id"])] / total == pytest.approx(c["fraction"], abs=0.02)
    screenshot = tmp_path / "try-it-segment.png"
    browser.save_screenshot(str(screenshot))
    if target := os.environ.get("TRY_IT_SEGMENT_SCREENSHOT"):
        shutil.copyfile(screenshot, ROOT / target)


def test_a_pose_model_draws_its_skeleton_where_the_api_puts_the_keypoints(segpose_service, browser, cat_png, tmp_path):
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(segpose_service.url + "/")
    choose(browser, wait, "figure")
    assert browser.find_element(By.ID, "classify").text == "Pose"
    minscore = browser.find_element(By.ID, "minscore")
    minscore.clear()
    minscore.send_keys("0.5")
    browser.find_element(By.ID, "file").send_keys(str(cat_png))
    wait.until(ec.element_to_be_clickable((By.ID, "classify"))).click()
    wait.until(lambda d: (drawn_overlay(d) or {}).get("joints"))
    shown = drawn_overlay(browser)
    api = httpx.post(f"{segpose_service.url}/v1/models/figure/pose?backend=cpu", content=cat_png.read_bytes(),
                     timeout=60).json()
    (joints,) = shown["joints"]
    expected = [k for k in api["poses"][0]["keypoints"] if k["score"] >= 0.5]
    assert 0 < len(joints) == len(expected) < 17  # only the keypoints at or above the minimum score
    for joint, keypoint in zip(joints, expected):
        assert joint["name"] == keypoint["name"]
        assert (joint["x"], joint["y"]) == (pytest.approx(keypoint["x"] * shown["scale"]),
                                            pytest.approx(keypoint["y"] * shown["scale"]))
    screenshot = tmp_path / "try-it-pose.png"
    browser.save_screenshot(str(screenshot))
    colours = {tuple(c) for c in np.asarray(Image.open(screenshot).convert("RGB")).reshape(-1, 3)}
    assert (0xF0, 0xE4, 0x42) in colours and (0xD5, 0x5E, 0x00) in colours  # the bones and the joints drawn
