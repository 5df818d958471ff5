"""The face API served end to end over real sockets: DeepStack's /v1/vision/face* (through Home Assistant's client,
deepstack-python's DeepstackFace, and as raw forms), the native /v1/faces, backup and restore, with the models the
tests build (tests/face_models.py: the tiny ULFD-shaped detector and the MobileFaceNet-shaped embedder), imported by
`converter import` and calibrated by `converter face-threshold` on photos of the test people.

- Home Assistant's client registers, recognizes and lists; a stranger is "unknown"; delete forgets;
- a registration survives a SIGKILL of the service (register, kill -9, start again, recognize);
- several processes registering at once (EDGETPU_SERVE_PROCESSES=2, clients in parallel) lose nothing;
- bad input gets DeepStack's error shape and a 4xx, never a 500: no face, an unknown or invalid userid, a huge
  image, a body too large, missing fields, not an image;
- while the face models are not set, every face route answers 503 saying the fix;
- a new embedder re-embeds the gallery from its stored regions at start, its vectors apart from the old one's;
- FACE_EDITS_NEED_ADMIN puts register and delete behind the admin key; backup and restore always are.
"""

from __future__ import annotations

import io
import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import schemathesis
from deepstack.core import DeepstackException, DeepstackFace
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from PIL import Image
from pydantic import ValidationError
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from app.core.face_models import FaceModels
from app.faces.gallery import Gallery
from app.faces.errors import FacesUnavailable
from app.settings import Settings, settings_problem
from converter.face_threshold import face_threshold
from converter.importer import ImportOptions, import_model
from tests.conftest import Service
from tests.face_import_models import face_box, face_landmarks, retinaface_like
from tests.face_models import FACE_SIDE, face_photo, tiny_face_detector, tiny_face_embedder
from tests.test_page import browser  # noqa: F401 (the try-it page's headless Chromium, a fixture)
from tests.waiting import until

pytestmark = pytest.mark.slow
load_all_checks()

API_KEY, ADMIN_KEY = "face-inference-key", "face-admin-key"
PEOPLE = range(6)       # registered in the tests (each under NAMES[k])
STRANGER = 7            # never registered
NAMES = {k: f"Person {k}" for k in PEOPLE}
WAIT_S = 120


def jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95)
    return out.getvalue()


def photo_of(k: int, variant: int, seed: int = 0, where: tuple[int, int] | None = None) -> bytes:
    rng = np.random.default_rng([k, variant, seed])
    left, top = where or (int(rng.integers(0, 320 - FACE_SIDE)), int(rng.integers(0, 240 - FACE_SIDE)))
    photo, _ = face_photo([(k, variant, (left, top, FACE_SIDE))], seed=1000 * k + variant + seed)
    return jpeg(photo)


def empty_photo() -> bytes:
    photo, _ = face_photo([], seed=5)
    return jpeg(photo)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("face_api")
    (root / "ulfd.tflite").write_bytes(tiny_face_detector())
    (root / "mfn.tflite").write_bytes(tiny_face_embedder("uint8", "first"))
    (root / "mfn8.tflite").write_bytes(tiny_face_embedder("int8", None))  # another file: another embedder
    (root / "retina.tflite").write_bytes(retinaface_like())  # landmarks: its one face is aligned on them
    for name in ("ulfd", "retina"):
        import_model([root / f"{name}.tflite"], ImportOptions(name=name, out=root / "models"))
    for name in ("mfn", "mfn8"):
        import_model([root / f"{name}.tflite"], ImportOptions(name=name, out=root / "models", task="embedding"))
    people = root / "people"
    for k in range(8):
        (people / f"p{k}").mkdir(parents=True)
        for variant in range(1, 4):
            (people / f"p{k}" / f"{variant}.jpg").write_bytes(photo_of(k, variant, seed=99))
    for name in ("mfn", "mfn8"):  # face.calibration written into each embedder's model.json
        face_threshold(root / "models", "ulfd", name, people)
    return root / "models"


def face_env(models: Path, db: Path, **more: str) -> dict[str, str]:
    return {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": "cpu", "EDGETPU_SERVE_WORKERS": "1",
            "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": "ulfd", "EDGETPU_SERVE_FACE_DETECTOR": "ulfd",
            "EDGETPU_SERVE_FACE_EMBEDDER": "mfn", "EDGETPU_SERVE_FACE_DB": str(db),
            "EDGETPU_SERVE_API_KEYS": API_KEY, "EDGETPU_SERVE_ADMIN_KEYS": ADMIN_KEY,
            "EDGETPU_SERVE_MAX_IMAGE_PIXELS": str(4_000_000), "EDGETPU_SERVE_MAX_BODY_BYTES": str(4 * 1024 * 1024),
            **more}


@pytest.fixture(scope="module")
def served(models, tmp_path_factory):
    db = tmp_path_factory.mktemp("gallery") / "faces.db"
    service = Service(face_env(models, db), inherit_settings=False).wait_ready(WAIT_S)
    try:
        yield service, db
    finally:
        service.stop()


def client_of(service) -> DeepstackFace:
    return DeepstackFace(ip="127.0.0.1", port=service.port, api_key=API_KEY, timeout=60)


def post(service, path: str, files=None, **fields) -> httpx.Response:
    data = {"api_key": API_KEY, **fields}
    return httpx.post(f"{service.url}{path}", data=data, files=files, timeout=60)


def assert_deepstack_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["success"] is False and isinstance(body["error"], str), body
    for word in words:
        assert word in body["error"], body


# ---- Home Assistant's client ---------------------------------------------------------------------------------

def test_home_assistants_client_registers_recognizes_lists_and_a_stranger_is_unknown(served):
    service, _ = served
    client = client_of(service)
    for k in PEOPLE:
        assert client.register(NAMES[k], photo_of(k, 1)) == "face added"
    assert sorted(client.get_registered_faces()) == sorted(NAMES.values())
    for k in PEOPLE:
        predictions = client.recognize(photo_of(k, 4, seed=1))  # a photo of them the gallery never saw
        assert len(predictions) == 1, predictions
        found = predictions[0]
        assert found["userid"] == NAMES[k] and 0.5 <= found["confidence"] <= 1, (k, found)
        assert set(found) >= {"userid", "confidence", "x_min", "y_min", "x_max", "y_max"}
    stranger = client.recognize(photo_of(STRANGER, 2))
    assert [p["userid"] for p in stranger] == ["unknown"], stranger
    faces = client.detect(photo_of(STRANGER, 2))
    assert len(faces) == 1 and faces[0]["confidence"] >= 0.6 and faces[0]["x_max"] > faces[0]["x_min"]


def test_min_confidence_cuts_and_the_default_is_the_threshold(served):
    service, _ = served
    client = client_of(service)
    client.register(NAMES[0], photo_of(0, 1))
    photo = photo_of(0, 5, seed=3)
    r = post(service, "/v1/vision/face/recognize", files={"image": photo})
    confidence = r.json()["predictions"][0]["confidence"]
    assert r.json()["predictions"][0]["userid"] == NAMES[0] and confidence >= 0.5
    above = post(service, "/v1/vision/face/recognize", files={"image": photo}, min_confidence=str(
        min(1.0, confidence + 1e-3)))
    assert above.json()["predictions"][0]["userid"] == "unknown" and above.json()["predictions"][0]["confidence"] == 0
    below = post(service, "/v1/vision/face/recognize", files={"image": photo}, min_confidence="0.3")
    assert below.json()["predictions"][0]["userid"] == NAMES[0]


def test_register_takes_several_images_and_the_largest_face_of_a_crowded_one_saying_so(served):
    service, _ = served
    crowd, _ = face_photo([(1, 2, (20, 40, 56)), (3, 1, (200, 120, 44))], seed=8)
    r = post(service, "/v1/vision/face/register", files=[("image", photo_of(2, 1)), ("image1", jpeg(crowd))],
             userid="Twice")
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert "image(s) 2" in r.json()["message"] and r.json()["faces"] == 2
    listed = httpx.get(f"{service.url}/v1/faces", headers={"X-API-Key": API_KEY}).json()
    assert {"userid": "Twice", "faces": 2} == {k: v for k, v in next(
        p for p in listed["people"] if p["userid"] == "Twice").items() if k in ("userid", "faces")}


def test_deepstacks_register_adds_each_photo_and_the_same_photo_once(served):
    """Clients train one photo a request (Double Take, Viseron, Home Assistant's teach_face): each adds a face, where
    DeepStack's register kept only the last; the same photo trained again adds none, and the message says so."""
    service, _ = served
    client = client_of(service)
    assert client.register("Trained", photo_of(1, 1)) == "face added"
    assert client.register("Trained", photo_of(1, 3)) == "face added"
    again = post(service, "/v1/vision/face/register", files={"image": photo_of(1, 1)}, userid="Trained")
    assert again.status_code == 200 and again.json()["faces"] == 2, again.text
    assert "1 of the faces were registered for 'Trained' already" in again.json()["message"]


def test_delete_forgets_a_person(served):
    service, _ = served
    client = client_of(service)
    client.register("Leaving", photo_of(4, 1))
    r = post(service, "/v1/vision/face/delete", userid="Leaving")
    assert r.status_code == 200 and r.json()["success"] is True
    assert "Leaving" not in client.get_registered_faces()
    assert_deepstack_error(post(service, "/v1/vision/face/delete", userid="Leaving"), 400, "Leaving")


def test_match_gives_the_similarity_of_two_photos(served):
    service, _ = served
    same = post(service, "/v1/vision/face/match", files={"image1": photo_of(3, 1), "image2": photo_of(3, 5)}).json()
    other = post(service, "/v1/vision/face/match", files={"image1": photo_of(3, 1), "image2": photo_of(5, 5)}).json()
    assert same["success"] and other["success"]
    assert same["similarity"] > other["similarity"] and same["confidence"] > 0.5 > other["confidence"]
    for answer in (same, other):  # DeepStack's scale, from the cosine
        assert 0 <= answer["similarity"] <= 1 and answer["similarity"] == pytest.approx((answer["cosine"] + 1) / 2)


# ---- the native routes ---------------------------------------------------------------------------------------

def test_native_routes_put_list_and_delete_a_person_replacing_or_adding(served):
    service, _ = served
    headers = {"X-API-Key": API_KEY}
    url = f"{service.url}/v1/faces/Native%20One"
    put = httpx.put(url, files={"image": photo_of(5, 1)}, headers=headers, timeout=60)
    assert put.status_code == 200 and put.json()["faces"] == 1, put.text
    added = httpx.put(url, params={"replace": "false"}, files={"image": photo_of(5, 2)}, headers=headers, timeout=60)
    assert added.json()["faces"] == 2 and added.json()["replaced"] == 0
    replaced = httpx.put(url, files={"image": photo_of(5, 3)}, headers=headers, timeout=60)
    assert replaced.json()["faces"] == 1 and replaced.json()["replaced"] == 2
    listed = httpx.get(f"{service.url}/v1/faces", headers=headers).json()
    person = next(p for p in listed["people"] if p["userid"] == "Native One")
    assert person["faces"] == 1 and person["covered"] is True
    assert [e["served"] for e in listed["embedders"]] == [True]
    gone = httpx.delete(url, headers=headers)
    assert gone.status_code == 200 and gone.json()["faces"] == 1
    again = httpx.delete(url, headers=headers)
    assert again.status_code == 404 and "Native One" in again.json()["error"]
    noface = httpx.put(url, files={"image": empty_photo()}, headers=headers, timeout=60)
    assert noface.status_code == 400 and "no face" in noface.json()["error"]
    assert httpx.get(f"{service.url}/v1/faces").status_code == 401


# ---- bad input -----------------------------------------------------------------------------------------------

def test_bad_input_gets_deepstacks_error_shape_never_a_500(served):
    service, _ = served
    register = "/v1/vision/face/register"
    assert_deepstack_error(post(service, register, files={"image": empty_photo()}, userid="Nobody"), 400, "no face")
    assert_deepstack_error(post(service, register, files={"image": photo_of(1, 1)}), 400, "userid")
    assert_deepstack_error(post(service, register, userid="Nobody"), 400, "image")
    assert_deepstack_error(post(service, register, files={"image": photo_of(1, 1)}, userid="unknown"), 400)
    assert_deepstack_error(post(service, register, files={"image": photo_of(1, 1)}, userid="two\nlines"), 400)
    assert_deepstack_error(post(service, register, files={"image": b"not an image"}, userid="Nobody"), 400)
    assert_deepstack_error(post(service, "/v1/vision/face/recognize"), 400, "image")
    assert_deepstack_error(post(service, "/v1/vision/face/recognize", files={"image": b"GIF89a"}), 400)
    assert_deepstack_error(post(service, "/v1/vision/face/recognize", files={"image": photo_of(1, 1)},
                                min_confidence="lots"), 400, "min_confidence")
    assert_deepstack_error(post(service, "/v1/vision/face/delete"), 400, "userid")
    assert_deepstack_error(post(service, "/v1/vision/face/match", files={"image1": photo_of(1, 1)}), 400, "image2")
    huge = io.BytesIO()
    Image.new("RGB", (2100, 2100)).save(huge, "PNG")  # 4.4 M pixels, over MAX_IMAGE_PIXELS (4 M)
    assert_deepstack_error(post(service, "/v1/vision/face/recognize", files={"image": huge.getvalue()}), 413)
    too_big = os.urandom(5 * 1024 * 1024)  # over MAX_BODY_BYTES (4 MiB)
    assert_deepstack_error(post(service, register, files={"image": too_big}, userid="Nobody"), 413)
    assert_deepstack_error(httpx.post(f"{service.url}/v1/vision/face/list", data={"api_key": "wrong"}), 401)
    assert "Nobody" not in client_of(service).get_registered_faces()
    with pytest.raises(DeepstackException):  # the client sees a failure, as it would from DeepStack
        client_of(service).register("Nobody", empty_photo())


# ---- backup and restore, the admin key -----------------------------------------------------------------------

def test_backup_and_restore_need_the_admin_key_and_bring_the_gallery_back(served):
    service, _ = served
    client = client_of(service)
    client.register("Kept", photo_of(2, 1))
    assert_deepstack_error(post(service, "/v1/backup"), 401, "admin key")
    saved = httpx.post(f"{service.url}/v1/backup", data={"admin_key": ADMIN_KEY}, timeout=60)
    assert saved.status_code == 200 and saved.content.startswith(b"SQLite format 3\x00"), saved.text[:200]
    client.register("Later", photo_of(3, 1))
    assert "Later" in client.get_registered_faces()
    assert_deepstack_error(post(service, "/v1/restore", files={"file": saved.content}), 401, "admin key")
    restored = httpx.post(f"{service.url}/v1/restore", data={"admin_key": ADMIN_KEY}, files={"file": saved.content},
                          timeout=60)
    assert restored.status_code == 200 and restored.json()["success"] is True, restored.text
    names = client.get_registered_faces()
    assert "Kept" in names and "Later" not in names
    bad = httpx.post(f"{service.url}/v1/restore", data={"admin_key": ADMIN_KEY}, files={"file": b"not a gallery"},
                     timeout=60)
    assert_deepstack_error(bad, 400)
    assert "Kept" in client.get_registered_faces()


# ---- the schema, fuzzed ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_the_face_routes_schema_fuzzed_no_server_error_and_no_drift(served, mode):
    """schemathesis' full check set on every face operation of the live service (its models set): whatever it
    sends with the admin key, no 5xx but the documented 503s, answers as their schemas say, valid forms accepted
    (or refused for what a schema cannot say: no face, a userid not registered, not an image) and invalid ones
    refused. tests/test_openapi_fuzz.py fuzzes every other operation."""
    service, _ = served
    client_of(service).register("Fuzz Witness", photo_of(2, 1))
    config = SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "413"]}}})
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json", config=config)
    operations = [op for op in (result.ok() for result in schema.get_all_operations())
                  if op.path.startswith(("/v1/vision/face", "/v1/faces", "/v1/backup", "/v1/restore"))]
    assert len(operations) == 11, [op.label for op in operations]
    ran = Counter()
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
        @settings(max_examples=12, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        def check(case):
            case.call_and_validate(base_url=service.url, headers={"X-API-Key": ADMIN_KEY}, checks=CHECKS.get_all())
            ran[case.operation.label] += 1

        try:
            check()
        except Unsatisfiable:  # nothing of this operation's request can be made invalid (no parameters)
            assert mode == "negative"
    assert len(ran) >= (11 if mode == "positive" else 4), ran
    assert "Fuzz Witness" in client_of(service).get_registered_faces()  # the gallery still answers


# ---- kills, processes, settings ------------------------------------------------------------------------------

def test_a_registration_survives_a_sigkill_of_the_service(models, tmp_path):
    db = tmp_path / "faces.db"
    first = Service(face_env(models, db), inherit_settings=False).wait_ready(WAIT_S)
    try:
        assert client_of(first).register("Survivor", photo_of(1, 1)) == "face added"
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(30)
    finally:
        first.stop()
    second = Service(face_env(models, db), inherit_settings=False).wait_ready(WAIT_S)
    try:
        predictions = client_of(second).recognize(photo_of(1, 4, seed=1))
        assert [p["userid"] for p in predictions] == ["Survivor"], (predictions, second.output()[-2000:])
    finally:
        second.stop()


def test_concurrent_registrations_from_several_processes_lose_nothing_and_edits_may_need_the_admin_key(
        models, tmp_path):
    """Two workers of one service (EDGETPU_SERVE_PROCESSES=2) and a second service on the same gallery: 18
    registrations at once, spread over three processes; every one is there, seen by each of them."""
    db = tmp_path / "faces.db"
    env = face_env(models, db, EDGETPU_SERVE_PROCESSES="2", EDGETPU_SERVE_FACE_EDITS_NEED_ADMIN="true")
    group = Service(env, inherit_settings=False).wait_ready(WAIT_S)
    alone = None
    try:
        alone = Service(face_env(models, db), inherit_settings=False).wait_ready(WAIT_S)
        refused = post(group, "/v1/vision/face/register", files={"image": photo_of(1, 1)}, userid="No Admin")
        assert_deepstack_error(refused, 401, "admin key")
        assert_deepstack_error(post(group, "/v1/vision/face/delete", userid="No Admin"), 401, "admin key")
        clients = [DeepstackFace(ip="127.0.0.1", port=group.port, api_key=ADMIN_KEY, timeout=120),
                   DeepstackFace(ip="127.0.0.1", port=alone.port, api_key=API_KEY, timeout=120)]

        def register(i: int) -> str:  # a new connection each: the group's spread over both workers
            return clients[i % 3 == 2].register(f"Crowd {i}", photo_of(i % 6, 1 + i % 3, seed=i))

        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(register, range(18))) == ["face added"] * 18
        expected = sorted(f"Crowd {i}" for i in range(18))
        assert sorted(client_of(alone).get_registered_faces()) == expected
        for _ in range(4):  # connections of their own: both workers asked, whichever takes each
            assert sorted(client_of(group).get_registered_faces()) == expected
    finally:
        group.stop()
        if alone is not None:
            alone.stop()


def test_while_the_face_models_are_not_set_every_face_route_answers_503_with_the_fix(models, tmp_path):
    env = face_env(models, tmp_path / "faces.db", EDGETPU_SERVE_FACE_DETECTOR="", EDGETPU_SERVE_FACE_EMBEDDER="")
    with Service(env, inherit_settings=False) as service:
        for path, files in (("/v1/vision/face", {"image": photo_of(1, 1)}), ("/v1/vision/face/register",
                            {"image": photo_of(1, 1)}), ("/v1/vision/face/recognize", {"image": photo_of(1, 1)}),
                            ("/v1/vision/face/list", None), ("/v1/vision/face/delete", None)):
            r = post(service, path, files=files, userid="Anyone")
            assert_deepstack_error(r, 503, "EDGETPU_SERVE_FACE_DETECTOR", "ulfd")
            bare = post(service, path)  # a form missing its fields: the setting is what to fix first
            assert_deepstack_error(bare, 503, "EDGETPU_SERVE_FACE_DETECTOR")
        headers = {"X-API-Key": API_KEY}
        for native in (httpx.get(f"{service.url}/v1/faces", headers=headers),
                       httpx.put(f"{service.url}/v1/faces/Anyone", headers=headers, files={"image": photo_of(1, 1)}),
                       httpx.delete(f"{service.url}/v1/faces/Anyone", headers=headers)):
            assert native.status_code == 503 and "EDGETPU_SERVE_FACE_DETECTOR" in native.json()["error"], native.text
    assert not (tmp_path / "faces.db").exists()  # no face models: no gallery file made


def test_a_new_embedder_re_embeds_the_gallery_from_its_regions_at_start(models, tmp_path):
    db = tmp_path / "faces.db"
    with Service(face_env(models, db), inherit_settings=False) as first:
        for k in (0, 3):
            assert client_of(first).register(NAMES[k], photo_of(k, 1)) == "face added"
    with Service(face_env(models, db, EDGETPU_SERVE_FACE_EMBEDDER="mfn8"), inherit_settings=False) as second:
        headers = {"X-API-Key": API_KEY}
        listed = until(lambda: (lambda found: found if all(p["covered"] for p in found["people"]) else None)(
            httpx.get(f"{second.url}/v1/faces", headers=headers).json()), WAIT_S, "the gallery re-embedded")
        assert [e["served"] for e in listed["embedders"]] == [False, True]  # the old vectors stay, apart
        assert all(e["vectors"] == 2 for e in listed["embedders"])
        for k in (0, 3):
            predictions = client_of(second).recognize(photo_of(k, 4, seed=1))
            assert [p["userid"] for p in predictions] == [NAMES[k]], (predictions, second.output()[-2000:])
        assert "re-embedded 2 faces" in second.output()


def test_a_detector_with_landmarks_aligns_the_face_and_the_gallery_keeps_them(models, tmp_path):
    """RetinaFace's 5 landmarks (tests/face_import_models.py: one face where its constants put it) go through
    registration into the stored region, in its pixels, and recognition aligns on them as registration did."""
    db = tmp_path / "faces.db"
    scene, _ = face_photo([(4, 1, (100, 80, 120))], size=(320, 320), seed=4)
    with Service(face_env(models, db, EDGETPU_SERVE_FACE_DETECTOR="retina"), inherit_settings=False) as service:
        assert client_of(service).register("Aligned", jpeg(scene)) == "face added"
        matched = post(service, "/v1/vision/face/match", files={"image1": jpeg(scene), "image2": jpeg(scene)}).json()
        assert matched["cosine"] > 0.95, matched  # the same pixels aligned the same way, JPEG apart
        recognized = client_of(service).recognize(jpeg(scene))
        assert [p["userid"] for p in recognized] == ["Aligned"], recognized
    with Gallery(db) as gallery:
        region = gallery.faces("Aligned")[0].region
    box = np.multiply(face_box(), 320)  # in the photo's pixels, as the detector gives them
    scale = (region.box[2] - region.box[0]) / (box[2] - box[0])
    expected = (face_landmarks() * 320 - box[:2]) * scale + region.box[:2]
    np.testing.assert_allclose(region.landmarks, expected, atol=0.01)


@pytest.mark.parametrize(("detector", "embedder", "words"), [
    (None, None, ("EDGETPU_SERVE_FACE_DETECTOR", "is unset", "ulfd")),
    ("mfn", "mfn", ("EDGETPU_SERVE_FACE_DETECTOR=mfn", "not a detection model", "ulfd")),
    ("ulfd", None, ("EDGETPU_SERVE_FACE_EMBEDDER", "is unset", "mfn")),
    ("ulfd", "gone", ("EDGETPU_SERVE_FACE_EMBEDDER=gone", "is not served", "mfn")),
])
def test_the_face_models_setting_problems_say_the_fix(detector, embedder, words):
    served = {"detection": ["ulfd"], "embedding": ["mfn"], None: ["ulfd", "mfn"]}
    models = FaceModels(Settings(face_detector=detector, face_embedder=embedder), lambda task: served[task])
    with pytest.raises(FacesUnavailable) as caught:
        models.pair()
    for word in words:
        assert word in str(caught.value)


def test_a_face_db_that_is_a_directory_stops_the_start_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETPU_SERVE_FACE_DB", str(tmp_path))
    with pytest.raises(ValidationError) as caught:
        Settings()
    line = settings_problem(caught.value)
    assert "\n" not in line and line.startswith("EDGETPU_SERVE_FACE_DB=")
    assert "is a directory" in line and str(tmp_path / "faces.db") in line and "Fix:" in line


# ---- the try-it page -----------------------------------------------------------------------------------------

def test_the_try_it_page_enrolls_a_person_and_shows_names_on_the_face_boxes(models, browser, tmp_path):
    """In headless Chromium (tests/test_page.py's): a photo enrolled under a name, then a photo of that person and a
    stranger recognized, each box drawn where DeepStack's recognize puts it, labelled with the name or unknown."""
    env = {k: v for k, v in face_env(models, tmp_path / "faces.db").items() if "KEYS" not in k}  # the page sends none
    driver = browser
    with Service(env, inherit_settings=False) as service:
        wait = WebDriverWait(driver, WAIT_S)
        driver.get(service.url + "/")
        wait.until(lambda d: d.find_element(By.ID, "faces").is_displayed())
        wait.until(lambda d: d.find_element(By.ID, "people").text == "0 people registered")
        enrolled = tmp_path / "ann.jpg"
        enrolled.write_bytes(photo_of(2, 1))
        driver.find_element(By.ID, "file").send_keys(str(enrolled))
        driver.find_element(By.ID, "person").send_keys("Ann")
        wait.until(lambda d: d.find_element(By.ID, "enroll").is_enabled())
        driver.find_element(By.ID, "enroll").click()
        wait.until(lambda d: d.find_element(By.ID, "message").text.startswith("Ann: 1 face registered"))
        wait.until(lambda d: d.find_element(By.ID, "people").text == "1 person registered")
        scene, _ = face_photo([(2, 4, (30, 60, FACE_SIDE)), (STRANGER, 2, (220, 120, FACE_SIDE))], seed=21)
        both = tmp_path / "both.jpg"
        both.write_bytes(jpeg(scene))
        driver.find_element(By.ID, "file").send_keys(str(both))
        wait.until(lambda d: d.find_element(By.ID, "recognize").is_enabled())
        driver.find_element(By.ID, "recognize").click()
        drawn = wait.until(lambda d: d.execute_script(
            "const c = document.querySelector('#results .faces-card canvas.boxes');"
            "return c ? {drawn: JSON.parse(c.dataset.drawn), scale: parseFloat(c.dataset.scale)} : null;"))
        api = httpx.post(f"{service.url}/v1/vision/face/recognize", files={"image": both.read_bytes()}, timeout=60)
        predictions = api.json()["predictions"]
        assert sorted(p["userid"] for p in predictions) == ["Ann", "unknown"], predictions
        assert [box["label"] for box in drawn["drawn"]] == [p["userid"] for p in predictions]
        for box, p in zip(drawn["drawn"], predictions):  # where the API puts it, on the canvas' scale (1: 320 wide)
            assert (box["x"], box["y"]) == (round(p["x_min"] * drawn["scale"]), round(p["y_min"] * drawn["scale"]))
            assert box["x"] + box["w"] == round(p["x_max"] * drawn["scale"])
        driver.save_screenshot(str(tmp_path / "try-it-faces.png"))
        if target := os.environ.get("TRY_IT_FACES_SCREENSHOT"):
            Path(target).write_bytes((tmp_path / "try-it-faces.png").read_bytes())


@pytest.mark.parametrize("processes", ["1", "2"])  # under gunicorn too: found before the workers fork
def test_a_face_db_holding_another_file_stops_the_start_in_one_line_and_is_left_untouched(models, tmp_path, processes):
    other = tmp_path / "notes.db"
    other.write_text("not a gallery\n")
    service = Service({**face_env(models, other), "EDGETPU_SERVE_PROCESSES": processes}, inherit_settings=False)
    try:
        assert service.process.wait(WAIT_S) == 2
    finally:
        output = service.stop()
    assert f"edgetpu-serve: cannot start: {other} is not an SQLite database" in output and "FACE_DB" in output
    assert "Traceback" not in output and other.read_text() == "not a gallery\n"
