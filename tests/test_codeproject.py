"""What Blue Iris calls to find and use a CodeProject.AI server (app/api/codeproject.py): the custom model list, taken
before DeepStack's /v1/vision/custom/{name}, the update check, and the key as DeepStack's routes take it."""

from __future__ import annotations

import httpx
import pytest

from app.settings import Settings
from tests.test_tasks import served

DETECTOR = "ssdlite_mobilenet_v2_person"
KEY = "blue-iris-key"


@pytest.fixture(scope="module")
def service():
    with served(Settings(backends=["cpu"], workers=1, models=[DETECTOR, "mobilenet_v2"], api_keys=[KEY])) as (app, url):
        yield url


def test_the_custom_list_names_the_detection_models(service):
    r = httpx.post(f"{service}/v1/vision/custom/list", data={"api_key": KEY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["models"] == [DETECTOR] and body["command"] == "list"
    # each listed model answers DeepStack's custom route, as Blue Iris then calls it
    assert httpx.post(f"{service}/v1/vision/custom/{DETECTOR}", data={"api_key": KEY},
                      files={"image": ("f.jpg", b"not an image")}).json()["success"] is False
    assert httpx.post(f"{service}/v1/vision/custom/list", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_the_key_is_checked_as_deepstack_checks_it(service):
    r = httpx.post(f"{service}/v1/vision/custom/list")
    assert r.status_code == 401 and r.json()["success"] is False and "Incorrect api key" in r.json()["error"]
    assert httpx.post(f"{service}/v1/vision/custom/list", data={"api_key": "wrong"}).status_code == 401


def test_no_update_is_ever_available(service):
    body = httpx.get(f"{service}/v1/status/updateavailable").json()
    assert body["success"] is True and body["updateAvailable"] is False
    assert body["current"] == body["latest"] and body["current"]["major"] == 0
