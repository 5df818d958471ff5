"""Frigate's ZMQ detector protocol (app/frontdoors), driven by a client written from the protocol (a pyzmq REQ socket,
bench/frigate_client.py, as Frigate's `zmq` detector behaves) against the service on a real socket.

- the messages: each refusal's reason, Frigate's SSD rule, both reply forms;
- the model check by model name and by file name; the model transfer accepted and refused (off, garbage, a classifier,
  a name already served, a compiled-only file on a host without a TPU), nothing written on a refusal;
- a wrong shape, a wrong dtype, a truncated frame, an oversized frame, a wrong frame count, a header that is no JSON,
  unknown and unserved model types: every request answered, with the reason, and counted in /metrics;
- two clients at once, each with its own model over one endpoint;
- the rows equal Frigate's SSD rule on TFLite's interpreter's outputs for the same tensor, on the committed person
  detector and on a tiny detector built here; /readyz, /v1/devices and /metrics cover the door.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import zmq
from ai_edge_litert.interpreter import Interpreter

from app.frontdoors.frigate import (
    REPLY_BYTES,
    ModelCheck,
    ModelUpload,
    Refused,
    TensorRequest,
    family_for,
    header_of,
    parse,
    ssd_rows,
    zero_reply,
)
from app.model_dir.reading import read_model_dir
from app.settings import Settings
from bench.frigate_client import FrigateClient, decode
from tests.classifier_models import tiny_classifier
from tests.conftest import MODELS
from tests.detection_models import output_names, square_image, tiny_detector
from tests.doubles.compiled_model_double import compiled_detector_bytes, compiled_model_bytes
from tests.test_tasks import model_dir, served

PERSON = "ssdlite_mobilenet_v2_person"
SIZE = 16
TIMEOUT_MS = 60_000  # generous: the machine may be loaded; nothing here waits for a timeout but the one test


def frames(*parts) -> list[memoryview]:
    return [memoryview(p if isinstance(p, bytes) else json.dumps(p).encode()) for p in parts]


def header(shape=(1, SIZE, SIZE, 3), dtype="uint8", model_type="ssd") -> dict:
    fields = {"shape": list(shape), "dtype": dtype}
    if model_type is not None:
        fields["model_type"] = model_type
    return fields


# ---- the messages ------------------------------------------------------------------------------------------

def test_each_request_is_read_or_refused_with_its_reason():
    tensor = bytes(SIZE * SIZE * 3)

    def read(request):
        return parse(request, header_of(request))

    request = read(frames(header(), tensor))
    assert isinstance(request, TensorRequest) and request.tensor().shape == (1, SIZE, SIZE, 3)
    assert read(frames({"model_request": True, "model_name": "a.tflite"})) == ModelCheck("a.tflite")
    upload = read(frames({"model_data": True, "model_name": "a.tflite"}, b"xyz"))
    assert isinstance(upload, ModelUpload) and bytes(upload.data) == b"xyz"
    cases = {
        "header": [frames(b"not json", tensor), frames([1, 2], tensor), frames({"shape": "big", "dtype": "uint8"}, tensor),
                   frames({"model_request": True}), frames({"shape": [1, -3, 4, 3], "dtype": "uint8"}, tensor)],
        "dtype": [frames(header(dtype="complex64"), tensor), frames(header(dtype="nope"), tensor),
                  frames(header(dtype=None), tensor)],
        "size": [frames(header(), tensor[:-1]), frames(header(), tensor + b"\0")],
        "frames": [frames(header()), frames(header(), tensor, b""), frames({"model_request": True, "model_name": "a"}, b"x"),
                   frames({"model_data": True, "model_name": "a"})],
    }
    for reason, requests in cases.items():
        for request in requests:
            with pytest.raises(Refused) as refused:
                parse(request, header_of(request))
            assert refused.value.reason == reason, (request, refused.value)


def test_model_types_frigate_sends_are_served_or_refused_with_the_reason():
    family_for("ssd", "ssd")
    family_for(None, "ssd")  # Frigate 0.16.0 sent none
    for model_type, words in (("yolox", "ONNX"), ("rfdetr", "ONNX"), ("dfine", "ONNX"), ("yolonas", "ONNX"),
                              ("yologeneric", "set Frigate's model_type to ssd"), ("resnet", "unknown model_type")):
        with pytest.raises(Refused, match=words) as refused:
            family_for(model_type, "ssd")
        assert refused.value.reason == "model_type"


def test_frigates_ssd_rule_stops_at_the_first_low_score_and_at_20_rows():
    n = 30
    boxes = np.arange(n * 4, dtype=np.float32).reshape(1, n, 4) / 1000
    classes = np.arange(n, dtype=np.float32).reshape(1, n)
    scores = np.full((1, n), 0.9, np.float32)
    rows = ssd_rows(boxes, classes, scores, np.array([n], np.float32))
    assert rows.shape == (20, 6) and rows.dtype == np.float32
    assert np.array_equal(rows[:, 0], classes[0, :20]) and np.array_equal(rows[:, 2:], boxes[0, :20])
    scores[0, 5] = 0.39  # rows in the model's order up to the first one below 0.4, even if later ones score higher
    rows = ssd_rows(boxes, classes, scores, np.array([n], np.float32))
    assert rows[:5, 1].tolist() == pytest.approx([0.9] * 5) and not rows[5:].any()
    assert not ssd_rows(boxes, classes, scores, np.array([2], np.float32))[2:].any()  # `count` bounds them
    assert not ssd_rows(boxes, classes, scores, np.array([np.nan], np.float32)).any()


def test_a_detection_answer_is_cut_as_frigates_ssd_rule_cuts_rows():
    """Families other than SSD are answered from the task's objects (best first, boxes normalized to the input)."""
    from app.frontdoors.serving import detection_rows
    from app.tasks.detect import Box, DetectedObject, Detection
    from app.tasks.results import ImageSize

    def found(class_id, score):
        box = Box(0.1 * class_id, 0.2, 0.3, 0.4)
        return DetectedObject(str(class_id), class_id, score, box, box)

    rows = detection_rows(Detection(ImageSize(320, 320), [found(i, 0.9 - i * 0.01) for i in range(30)]))
    assert rows.shape == (20, 6) and rows[:, 0].tolist() == list(range(20))
    assert rows[3].tolist() == pytest.approx([3, 0.87, 0.2, 0.3, 0.4, 0.3])  # [class, score, ymin, xmin, ymax, xmax]
    rows = detection_rows(Detection(ImageSize(320, 320), [found(1, 0.8), found(2, 0.39), found(3, 0.38)]))
    assert rows[0, 0] == 1 and not rows[1:].any()


def test_a_refusal_is_zero_rows_in_the_form_the_request_came_in():
    refused = Refused("shape", "wrong shape")
    with_header = zero_reply(refused, header())
    assert json.loads(with_header[0]) == {"shape": [20, 6], "dtype": "float32", "error": "wrong shape"}
    assert not decode(with_header).any()
    assert zero_reply(refused, None) == [bytes(REPLY_BYTES)]


def test_a_bind_beyond_loopback_needs_its_own_setting():
    Settings(zmq_endpoint="tcp://127.0.0.1:5555")
    Settings(zmq_endpoint="ipc:///tmp/cache/zmq_detector")
    with pytest.raises(ValueError, match="the door admits peers by address. Fix: set EDGETPU_SERVE_ZMQ_ALLOW_FROM"):
        Settings(zmq_endpoint="tcp://0.0.0.0:5555")
    Settings(zmq_endpoint="tcp://0.0.0.0:5555", zmq_allow_remote=True)
    Settings(zmq_endpoint="tcp://0.0.0.0:5555", zmq_allow_from="192.168.1.20,10.0.0.0/24", zmq_upload_from="10.0.0.7")
    with pytest.raises(ValueError, match="'frigate.lan' is not an address or a CIDR"):
        Settings(zmq_endpoint="tcp://0.0.0.0:5555", zmq_allow_from="frigate.lan")
    with pytest.raises(ValueError, match="ZMQ_UPLOAD_FROM names 192.168.1.30, which ZMQ_ALLOW_FROM does not let"):
        Settings(zmq_endpoint="tcp://0.0.0.0:5555", zmq_allow_from="10.0.0.0/24", zmq_upload_from="192.168.1.30")
    with pytest.raises(ValueError, match="an abstract socket: it has no file"):
        Settings(zmq_endpoint="ipc://@frigate")
    Settings(zmq_endpoint="ipc://@frigate", zmq_allow_abstract=True)
    with pytest.raises(ValueError, match="tcp://HOST:PORT or ipc://PATH"):
        Settings(zmq_endpoint="inproc://x")


# ---- over the socket ---------------------------------------------------------------------------------------

def interpreter_rows(model: Path, tensor: np.ndarray) -> np.ndarray:
    """Frigate's own path: TFLite's interpreter, outputs 0-3 by position (boxes, classes, scores, count), its rule."""
    interpreter = Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], tensor)
    interpreter.invoke()
    boxes, classes, scores, count = (interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details())
    return ssd_rows(boxes, classes, scores, count)


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """The service with its ZMQ door on an ipc socket: the person detector (the default) and a tiny detector; uploads
    accepted into the model directory (a copy)."""
    root = tmp_path_factory.mktemp("models")
    import shutil
    shutil.copytree(MODELS / PERSON, root / PERSON)
    model_dir(root, "squares", tiny_detector(SIZE, order="tf1"), "detection", SIZE, output_names("tf1"))
    endpoint = f"ipc://{root}/zmq_detector"
    settings = Settings(model_dir=root, backends=["cpu"], workers=1, zmq_endpoint=endpoint, zmq_accept_models=True,
                        zmq_max_model_bytes=2 * 1024 * 1024)
    with served(settings) as (app, url):
        yield app, url, endpoint, root


def client(endpoint: str, name: str, **options) -> FrigateClient:
    return FrigateClient(endpoint, name, timeout_ms=TIMEOUT_MS, context=zmq.Context(), **options)


def person_tensor() -> np.ndarray:
    from converter.photos import people_photos
    from PIL import Image

    photo = next(p for p in people_photos() if p.name == "basketball1.png")
    pixels = np.asarray(Image.open(photo).convert("RGB").resize((300, 300), Image.BILINEAR), np.uint8)
    return pixels[None]


def test_the_rows_are_frigates_ssd_rule_on_tflites_outputs(door):
    app, url, endpoint, root = door
    person = client(endpoint, PERSON)
    assert person.start() and person.answers[-1]["model_loaded"]
    tensor = person_tensor()
    rows = person.detect(tensor)
    expected = interpreter_rows(MODELS / PERSON / f"{PERSON}_int8.tflite", tensor)
    assert (rows[:, 1] > 0.4).sum() >= 2, rows  # the two players
    assert np.array_equal(rows[:, 0], expected[:, 0])
    assert np.abs(rows[:, 1:] - expected[:, 1:]).max() <= 0.02

    squares = client(endpoint, "squares_int8.tflite")  # by a file's name
    assert squares.start()
    tensor = square_image(SIZE, 4, 8, 4)[None]
    rows = squares.detect(tensor)
    expected = interpreter_rows(root / "squares" / "squares_int8.tflite", tensor)
    assert rows[0, 1] > 0.4 and np.array_equal(rows[:, 0], expected[:, 0])
    assert np.abs(rows[:, 1:] - expected[:, 1:]).max() <= 0.02


def test_every_bad_request_is_answered_with_its_reason_and_counted(door):
    app, url, endpoint, root = door
    frigate = client(endpoint, "squares")
    assert frigate.start()
    good = np.zeros((1, SIZE, SIZE, 3), np.uint8)
    raw = good.tobytes()
    hdr = json.dumps(header()).encode()
    bad = [  # (request, words of the reason it is answered with)
        ([json.dumps(header((1, SIZE * 2, SIZE // 2, 3))).encode(), raw], "takes a tensor of shape [1, 16, 16, 3]"),
        ([json.dumps(header(dtype="int8")).encode(), raw], "takes uint8, this tensor is int8"),
        ([hdr, raw[:-10]], "the tensor frame has 758 bytes"),  # a truncated frame
        ([hdr, raw * 40], "the tensor frame has 30720 bytes"),  # an oversized one
        ([hdr], "has 2 frame(s), this one 1"),
        ([hdr, raw, raw], "has 2 frame(s), this one 3"),
        ([json.dumps(header(model_type="yolox")).encode(), raw], "yolox models are ONNX graphs"),
        ([json.dumps(header(model_type="banana")).encode(), raw], "unknown model_type 'banana'"),
    ]
    for request, words in bad:
        reply = frigate.ask(request)
        assert len(reply) == 2 and not decode(reply).any(), reply
        assert words in json.loads(reply[0])["error"], (words, reply[0])
    assert frigate.ask([b"\xff\x00 not json", raw]) == [bytes(REPLY_BYTES)]
    assert frigate.ask([json.dumps({"model_request": True}).encode()]) == [json.dumps(
        {"model_available": False, "model_loaded": False, "message": "the header has no model_name (the base name "
                                                                     "of Frigate's model.path)"}).encode()]
    assert frigate.detect(good).shape == (20, 6)  # and it still serves this client
    metrics = httpx.get(f"{url}/metrics").text
    for reason in ("shape", "dtype", "size", "frames", "model_type", "header"):
        assert f'edgetpu_serve_zmq_refusals_total{{reason="{reason}"}}' in metrics, reason
    assert 'backend="cpu",model="squares",protocol="zmq",status="200",task="detection"' in metrics
    assert 'backend="",model="squares",protocol="zmq",status="400",task="detection"' in metrics


def test_two_clients_at_once_each_with_its_own_model(door):
    app, url, endpoint, root = door
    tensors = {PERSON: person_tensor(), "squares": square_image(SIZE, 4, 8, 4)[None]}
    expected = {PERSON: interpreter_rows(MODELS / PERSON / f"{PERSON}_int8.tflite", tensors[PERSON]),
                "squares": interpreter_rows(root / "squares" / "squares_int8.tflite", tensors["squares"])}
    results: dict[str, list] = {name: [] for name in tensors}

    def run(name):
        frigate = client(endpoint, name)
        assert frigate.start()
        for _ in range(10):
            results[name].append(frigate.detect(tensors[name]))

    threads = [threading.Thread(target=run, args=(name,)) for name in tensors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for name, rows in results.items():
        assert len(rows) == 10, name
        for got in rows:
            assert np.array_equal(got[:, 0], expected[name][:, 0]) and np.abs(got - expected[name]).max() <= 0.02


def test_many_clients_at_once_every_request_answered(door):
    """Twelve REQ clients, good and bad requests interleaved, all at once: the door reads its socket by its
    edge-triggered descriptor, so a lost edge would leave a client without its reply (and this test waiting)."""
    app, url, endpoint, root = door
    good = square_image(SIZE, 4, 8, 4)[None]
    answered: list[tuple[bool, bool]] = []

    def run(i):
        frigate = client(endpoint, "squares")
        assert frigate.start()
        for j in range(15):
            if (i + j) % 3:
                answered.append((True, bool(frigate.detect(good)[0, 1] > 0.4)))
            else:
                reply = frigate.ask([json.dumps(header(shape=(1, 2, 2, 3))).encode(), bytes(12)])
                answered.append((False, "error" in json.loads(reply[0])))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(answered) == 12 * 15 and all(ok for _, ok in answered)


def test_a_peer_without_a_model_request_gets_the_detector_its_tensor_fits(door):
    app, url, endpoint, root = door
    frigate = client(endpoint, "unused")  # never started: the door restarted under it, say
    rows = frigate.detect(square_image(SIZE, 4, 8, 4)[None])
    assert rows[0, 1] > 0.4  # the tiny detector, the only one taking 16x16


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "zmq_detector" not in p.name}


def test_model_transfer_accepted_loaded_and_never_replacing(door, tmp_path):
    app, url, endpoint, root = door
    upload = tmp_path / "boxes_edgetpu_free.tflite"
    upload.write_bytes(tiny_detector(SIZE, order="tf2"))
    frigate = client(endpoint, upload.name, model_path=upload)
    assert frigate.start(), frigate.answers
    assert frigate.answers[0]["model_available"] is False
    assert frigate.answers[1]["model_saved"] and frigate.answers[1]["model_loaded"]
    written = read_model_dir(root / "boxes_edgetpu_free")
    assert written.manifest.imported.files[0].name == upload.name
    assert "uploaded by a Frigate ZMQ client" in written.manifest.build.command
    rows = frigate.detect(square_image(SIZE, 4, 8, 4)[None])
    assert rows[0, 1] > 0.4
    # asked again: served at once (by its file's name as sent)
    again = client(endpoint, upload.name, model_path=upload)
    assert again.start() and len(again.answers) == 1
    # sent again under the same name: never replaced, and nothing written
    before = {p: p.stat().st_mtime_ns for p in (root / "boxes_edgetpu_free").iterdir()}
    header = json.dumps({"model_data": True, "model_name": upload.name}).encode()
    answer = json.loads(again.ask([header, tiny_detector(SIZE, order="tf1")])[0])
    assert answer["model_saved"] is False and "not replaced" in answer["message"]
    assert {p: p.stat().st_mtime_ns for p in (root / "boxes_edgetpu_free").iterdir()} == before


def test_model_transfer_refusals_write_nothing(door, tmp_path):
    app, url, endpoint, root = door
    before = listing(root)
    compiled = compiled_model_bytes()
    cases = {
        "garbage.tflite": (b"\0" * 1000, "not a TFLite model"),
        "classifier.tflite": (tiny_classifier(), "classifier"),
        "model.onnx": (tiny_detector(SIZE), "not a .tflite file"),
        "huge.tflite": (b"\0" * (2 * 1024 * 1024 + 1), "more than this service takes "
                                                       "(EDGETPU_SERVE_ZMQ_MAX_MODEL_BYTES=2097152)"),
        "ssd_edgetpu.tflite": (compiled, ""),
    }
    for name, (data, words) in cases.items():
        frigate = client(endpoint, name)
        header = json.dumps({"model_data": True, "model_name": name}).encode()
        answer = json.loads(frigate.ask([header, data])[0])
        assert answer["model_saved"] is False and answer["model_loaded"] is False, (name, answer)
        assert words in answer["message"], (name, answer)
    assert listing(root) == before


def test_a_compiled_only_upload_on_a_host_without_a_tpu_says_so(door, tmp_path):
    app, url, endpoint, root = door
    before = listing(root)
    frigate = client(endpoint, "edgetpu_model.tflite")
    header = json.dumps({"model_data": True, "model_name": "edgetpu_model.tflite"}).encode()
    answer = json.loads(frigate.ask([header, compiled_detector_bytes()])[0])
    assert answer["model_saved"] is False and "compiled for the Edge TPU only" in answer["message"], answer
    assert listing(root) == before


def test_readiness_devices_and_metrics_cover_the_door(door):
    app, url, endpoint, root = door
    assert httpx.get(f"{url}/readyz").status_code == 200
    report = httpx.get(f"{url}/v1/devices").json()["frontdoors"]["zmq"]
    assert report["endpoint"] == endpoint and report["serving"] and report["accept_models"]
    assert report["answered"] >= 1


def test_uploads_off_a_model_data_is_refused_and_an_unknown_name_gets_the_default(tmp_path):
    import shutil
    shutil.copytree(MODELS / PERSON, tmp_path / PERSON)
    endpoint = f"ipc://{tmp_path}/zmq_detector"
    settings = Settings(model_dir=tmp_path, backends=["cpu"], workers=1, zmq_endpoint=endpoint)
    with served(settings) as (app, url):
        before = listing(tmp_path)
        frigate = client(endpoint, "cpu_model.tflite")
        assert frigate.start()  # no such model, uploads off: the default detector answers
        assert "default detector" in frigate.answers[0]["message"]
        header = json.dumps({"model_data": True, "model_name": "x.tflite"}).encode()
        answer = json.loads(frigate.ask([header, tiny_detector(SIZE)])[0])
        assert answer["model_saved"] is False and "ZMQ_ACCEPT_MODELS" in answer["message"]
        assert listing(tmp_path) == before
        # a file is refused at its frame's head, before a byte of it is read: its peer answered, saying why
        big = client(endpoint, PERSON)
        answer = json.loads(big.ask([header, bytes(64 * 1024 * 1024 + 128 * 1024)])[0])
        assert answer["model_saved"] is False and "ZMQ_ACCEPT_MODELS" in answer["message"], answer
        assert big.start()  # libzmq's REQ connects again by itself: the same client is answered
        assert frigate.start()  # and the door serves the others


# ---- what ships beside the door ----------------------------------------------------------------------------

def test_the_door_imports_neither_the_converter_nor_a_web_framework_nor_tensorflow():
    """The uploads check files with app/importing, never converter/ (whose commands import TensorFlow and torch)."""
    import subprocess
    import sys

    code = ("import sys; import app.frontdoors.zmq_door, app.frontdoors.uploads, app.frontdoors.serving, "
            "app.frontdoors.frigate; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('converter', 'tensorflow', 'torch', 'fastapi', 'starlette', 'uvicorn')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_frigate_compose_file_and_config_match_the_door():
    import yaml

    from app.engines import BACKENDS
    from app.settings import variable_names
    from tests.conftest import ROOT

    compose = yaml.safe_load((ROOT / "docker" / "frigate" / "compose.yaml").read_text())
    known = variable_names(BACKENDS.values())
    endpoints = {}
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        assert set(k for k in env if k.startswith("EDGETPU_SERVE_")) <= known, name
        if "EDGETPU_SERVE_ZMQ_ENDPOINT" in env:
            Settings(zmq_endpoint=env["EDGETPU_SERVE_ZMQ_ENDPOINT"],
                     zmq_allow_remote=env.get("EDGETPU_SERVE_ZMQ_ALLOW_REMOTE") == "true")  # binds as set
            endpoints[service["profiles"][0]] = env["EDGETPU_SERVE_ZMQ_ENDPOINT"]
    assert endpoints == {"tcp": "tcp://0.0.0.0:5555", "ipc": "ipc:///run/zmq/detector"}
    frigate = yaml.safe_load((ROOT / "docker" / "frigate" / "config.yml").read_text())
    detector = frigate["detectors"]["coral"]
    assert detector["type"] == "zmq" and detector["endpoint"] == "tcp://edgetpu-serve:5555"
    model = frigate["model"]
    served = read_model_dir(MODELS / PERSON).manifest
    assert Path(model["path"]).name == PERSON and model["model_type"] == "ssd"
    assert (model["width"], model["height"]) == (served.input.width, served.input.height)
    assert (model["input_tensor"], model["input_pixel_format"], model["input_dtype"]) == ("nhwc", "rgb", "int")


def test_registry_add_serves_a_new_directory_and_never_replaces(tmp_path):
    """Registry.add, the entry point the uploads use: a directory written while serving is loaded, warmed up and
    served; a second one of the same name is refused; one that fails to load leaves the registry as it was."""
    from app.errors import ModelDirError
    from app.registry import Registry

    model_dir(tmp_path, "first", tiny_detector(SIZE), "detection", SIZE, output_names("tf1"))
    registry = Registry(Settings(model_dir=tmp_path, backends=["cpu"], workers=1))
    registry.configure()
    registry.load_all()
    try:
        added = model_dir(tmp_path, "second", tiny_detector(SIZE, order="tf2"), "detection", SIZE,
                          output_names("tf2"))
        version = registry.add(added)
        assert registry.names() == ["first", "second"] and registry.serving("second") is version
        assert registry.status("second").state == "ready" and version.pools["cpu"].members.warm
        with pytest.raises(ModelDirError, match="served already"):
            registry.add(added)
        assert registry.serving("second") is version
        broken = model_dir(tmp_path, "broken", tiny_detector(SIZE), "detection", SIZE, {"boxes": "nope"})
        with pytest.raises(ModelDirError):
            registry.add(broken)
        assert registry.names() == ["first", "second"]
    finally:
        registry.close()
