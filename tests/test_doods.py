"""DOODS' API for Home Assistant (app/api/doods.py): pydoods from PyPI, in its own venv, lists the detectors and finds
the two people of a camera frame with the committed person detector, its key in `doods-auth-key`; DOODS2's filter
(labels, "*", regions) and its errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading

import httpx
import pytest

from app.api.doods import Region, filtered
from app.api.json_image import REST_BYTES
from app.settings import Settings
from app.tasks.detect import Box, DetectedObject
from bench.client_venv import ensure_venv
from converter.photos import people_photos
from tests.conftest import ROOT, Service
from tests.test_tasks import served
from tests.waiting import until

DETECTOR = "ssdlite_mobilenet_v2_person"
KEY = "doods-test-key"
CLIENT = ROOT / "tests" / "clients" / "doods_detect.py"


def frame() -> bytes:
    return next(p for p in people_photos() if p.name == "basketball1.png").read_bytes()


@pytest.fixture(scope="module")
def service():
    settings = Settings(backends=["cpu"], workers=1, models=[DETECTOR], api_keys=[KEY])
    with served(settings) as (app, url):
        yield url


def test_pydoods_lists_the_detectors_and_finds_the_people(service):
    python = ensure_venv("pydoods", ["pydoods==1.0.2"], share=True)
    photo = next(p for p in people_photos() if p.name == "basketball1.png")
    for detector in ("default", DETECTOR):
        out = subprocess.run([str(python), str(CLIENT), service, str(photo), KEY, detector], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        names = {d["name"]: d for d in result["detectors"]["detectors"]}
        assert set(names) == {"default", DETECTOR}
        assert names["default"] == {**names[DETECTOR], "name": "default"}
        assert names[DETECTOR]["labels"] == ["person"] and (names[DETECTOR]["width"], names[DETECTOR]["height"]) == \
            (300, 300)
        found = result["detections"]
        assert found["id"] == "test" and [d["label"] for d in found["detections"]] == ["person", "person"]
        for d in found["detections"]:
            assert 0 <= d["left"] < d["right"] <= 1 and 0 <= d["top"] < d["bottom"] <= 1 and d["confidence"] > 50
        assert sorted(round(d["left"] * 640) for d in found["detections"]) == [29, 437]
        assert len(result["all"]["detections"]) >= 2  # "*": every label at its minimum
        assert result["wrong_key"] == 401


def test_errors_are_doods_shape_with_the_services_statuses(service):
    headers = {"doods-auth-key": KEY}
    r = httpx.post(f"{service}/detect", json={"data": "!!", "detect": {"*": 50}}, headers=headers)
    assert r.status_code == 400 and "base64" in r.json()["error"]
    r = httpx.post(f"{service}/detect", json={"data": base64.b64encode(frame()).decode(), "detector_name": "nope",
                                              "detect": {"*": 50}}, headers=headers)
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = httpx.post(f"{service}/detect", content=b"{not json", headers=headers)
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{service}/detect", json={"data": base64.b64encode(b"not an image").decode(),
                                              "detect": {"*": 50}}, headers=headers)
    assert r.status_code == 400
    assert httpx.get(f"{service}/detectors").status_code == 401
    assert httpx.get(f"{service}/detectors", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    metrics = httpx.get(f"{service}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert f'backend="cpu",model="{DETECTOR}",protocol="doods",status="200"' in metrics
    assert 'backend="",model="",protocol="doods",status="400"' in metrics


def test_the_image_is_read_with_json_escapes_and_the_request_beside_it_is_bounded(service):
    headers = {"doods-auth-key": KEY}
    plain = json.dumps({"id": "a", "data": base64.b64encode(frame()).decode(), "detect": {"*": 50}}).encode()
    escaped = plain.replace(b"/", b"\\/")  # as PHP's json_encode writes every slash
    assert escaped != plain and json.loads(escaped) == json.loads(plain)
    answers = [httpx.post(f"{service}/detect", content=body, headers=headers, timeout=60) for body in (plain, escaped)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["detections"] == answers[1].json()["detections"] != []
    twice = b'{"data": "QUJD", ' + plain[1:]
    r = httpx.post(f"{service}/detect", content=twice, headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "not DOODS' detect request: 'data' given twice"
    padded = plain[:-1] + b', "id2": "' + b"x" * REST_BYTES + b'"}'
    r = httpx.post(f"{service}/detect", content=padded, headers=headers)
    assert r.status_code == 413 and "beside its image" in r.json()["error"]
    r = httpx.post(f"{service}/detect", json={"data": "QUJD\\u0041", "detect": {"*": 50}}, headers=headers)
    assert r.status_code == 400 and "not base64" in r.json()["error"]


MIB = 1024 * 1024
BODY_MIB, BUDGET_MIB = 4, 16  # MAX_BODY_BYTES and MAX_BODY_BYTES_IN_FLIGHT of the service below
# Beside the bodies the budget counts, a service holds up to 64 KiB of each connection's body that uvicorn has read
# before the door reads it, and what its allocator keeps of small objects: measured within 0.6 MiB of the budget at
# its peak (docs/security.md). 8 MiB is room for a loaded machine's interleavings, and less than two bodies: one
# body per request that outlived it (the defect this guards) fails it.
MARGIN_MIB = 8


def test_base64_bodies_that_are_not_images_hold_no_more_than_the_budget_and_leave_nothing():
    """DOODS' bodies: 5.2 MB of base64 that decodes to no image, 8 one after another on one connection, then 12 at
    once: the service's peak resident memory stays within the body budget of its idle, and it goes back to idle."""
    env = {"EDGETPU_SERVE_MODELS": DETECTOR, "EDGETPU_SERVE_BACKENDS": "cpu", "EDGETPU_SERVE_WORKERS": "1",
           "EDGETPU_SERVE_IMAGE_THREADS": "1", "EDGETPU_SERVE_MAX_BODY_BYTES": str(BODY_MIB * MIB),
           "EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT": str(BUDGET_MIB * MIB), "EDGETPU_SERVE_WAIT_TIMEOUT_S": "60",
           "EDGETPU_SERVE_LOG_LEVEL": "warning"}
    bad = json.dumps({"data": base64.b64encode(os.urandom(BODY_MIB * MIB - 100_000)).decode(),
                      "detect": {"*": 50}}).encode()
    good = json.dumps({"data": base64.b64encode(frame()).decode(), "detect": {"*": 50}}).encode()
    with Service(env) as svc:
        with httpx.Client(timeout=120) as client:
            # every path warmed up: a detection, and a refusal
            assert [client.post(f"{svc.url}/detect", content=body).status_code for body in (good, bad)] == [200, 400]
        svc.reset_peak_memory()
        idle = svc.memory_mb()["VmRSS"]
        with httpx.Client(timeout=120) as client:
            one_by_one = [client.post(f"{svc.url}/detect", content=bad).status_code for _ in range(8)]
        statuses = []

        def client() -> None:
            with httpx.Client(timeout=120) as each:
                statuses.append(each.post(f"{svc.url}/detect", content=bad).status_code)

        threads = [threading.Thread(target=client) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        peak = svc.memory_mb()["VmHWM"]
        assert one_by_one == [400] * 8 and len(statuses) == 12 and set(statuses) <= {400, 503}, statuses
        assert peak - idle <= BUDGET_MIB + MARGIN_MIB, f"peak {peak:.1f} MiB, idle {idle:.1f} MiB"
        # the bodies are gone, not kept by the requests that refused them (malloc's trim follows within a second)
        until(lambda: svc.memory_mb()["VmRSS"] - idle <= MARGIN_MIB / 2, 30, "resident memory back to idle",
              poll_s=0.2)


def obj(label: str, score: float, x_min: float, y_min: float, x_max: float, y_max: float) -> DetectedObject:
    box = Box(x_min, y_min, x_max, y_max)
    return DetectedObject(label, 0, score, box, box)


def test_the_filter_is_doods2s():
    objects = [obj("person", 0.9, 0.1, 0.1, 0.3, 0.5), obj("car", 0.6, 0.5, 0.5, 0.9, 0.9),
               obj("dog", 0.45, 0.0, 0.0, 0.2, 0.2)]
    labels = lambda kept: [(k["label"], k.get("region_id")) for k in kept]  # noqa: E731
    assert labels(filtered(objects, {"person": 50}, [])) == [("person", None)]
    assert labels(filtered(objects, {"person": 95, "*": 50}, [])) == [("car", None)]  # a listed label: its own
    assert labels(filtered(objects, {"*": 40}, [])) == [("person", None), ("car", None), ("dog", None)]
    assert filtered(objects, {}, []) == []  # DOODS2: nothing asked, nothing kept
    regions = [Region(top=0.4, left=0.4, bottom=1, right=1, detect={"*": 50}, covers=True, id="drive")]
    assert labels(filtered(objects, {}, regions)) == [("car", "drive")]
    touching = [Region(top=0.15, left=0.15, bottom=0.25, right=0.25, detect={"person": 50}, id="door")]
    assert labels(filtered(objects, {}, touching)) == [("person", "door")]
    assert filtered(objects, {"person": 50}, [])[0]["confidence"] == pytest.approx(90)
