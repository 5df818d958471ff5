"""DOODS' API for Home Assistant (app/api/doods.py): pydoods from PyPI, in its own venv, lists the detectors and finds
the two people of a camera frame with the committed person detector, its key in `doods-auth-key`; DOODS2's filter
(labels, "*", regions) and its errors."""

from __future__ import annotations

import base64
import json
import subprocess

import httpx
import pytest

from app.api.doods import Region, filtered
from app.settings import Settings
from app.tasks.detect import Box, DetectedObject
from bench.client_venv import ensure_venv
from converter.photos import people_photos
from tests.conftest import ROOT
from tests.test_tasks import served

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
