"""Detection served, over real sockets: /v1/detect, DeepStack's /v1/vision/*, OIP v2 and /metrics on the tiny
detectors of tests/detection_models.py and on the committed person detector.

- every exporter's output order and both feeds load and give the same boxes (roles by tensor name), on cpu and on
  emulated;
- boxes map back to the original image exactly: stretch and letterbox, PNG and JPEG decoded at 1/8 scale (the
  DCT draft), EXIF-rotated, with a white rectangle at known pixels that the tiny detector finds cell by cell;
- labels with gaps (Coral's `id label` form through `converter import`) name the right classes;
- the default detector finds the people on real photos, its boxes equal TFLite's interpreter's within a pixel on cpu,
  and on emulated its outputs are TFLite's reference kernels' byte for byte;
- a DeepStack client library from PyPI gets boxes, with the API key as the form field it sends;
- bad input is a 4xx with JSON (DeepStack's shape on its routes), never a 500.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, ImageOps

from app.api.deps import service_of
from app.api.routes import InferenceRoutes
from app.api.shedding import HeadAdmission
from app.engines import BACKENDS
from app.imaging.decoding import Source, decode, decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.api.app import inference_routers
from app.model_dir.reading import read_model_dir
from app.settings import Settings
from app.tasks import OutputRoles
from app.tasks.detect import objects
from bench.client_venv import ensure_venv
from converter.importer import ImportOptions, import_model, parse_labels
from converter.model_dir import write_model_dir
from converter.photos import people_photos
from tests.conftest import MODELS, ROOT
from tests.detection_models import OUTPUT_ORDERS, output_names, tiny_detector
from tests.test_http_server import read_response
from tests.test_ssdlite_mobilenet_v2_person import PEOPLE, pixel_iou
from tests.test_tasks import served

DETECTOR = "ssdlite_mobilenet_v2_person"
KEY = "detect-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CLIENT_SCRIPT = ROOT / "tests" / "clients" / "deepstack_detect.py"
FEEDS = ("dequantize", "uint8")
SIZE = 16  # the tiny detectors' input; one anchor per 4x4 cell


# ---- tiny detectors, and images where they find a rectangle cell by cell ---------------------------------------

def detector_dir(root: Path, name: str, model: bytes, order: str, resize: str = "stretch") -> Path:
    """The pixels go in as they are (uint8, scale 1/255: mean 0, std 255)."""
    manifest = {"name": name, "task": "detection", "source": "built by tests/test_detect.py", "licence": "MIT",
                "input": {"width": SIZE, "height": SIZE, "resize": resize, "mean": [0, 0, 0], "std": [255] * 3},
                "outputs": output_names(order)}
    files = {"int8": (f"{name}_int8.tflite", model), "labels": ("labels.txt", b"square\n")}
    return write_model_dir(root, manifest, files)


def rectangle(width: int, height: int, box: tuple[int, int, int, int]) -> Image.Image:
    """Black, with a white rectangle (left, top, right, bottom), as a viewer shows it."""
    pixels = np.zeros((height, width, 3), np.uint8)
    left, top, right, bottom = box
    pixels[top:bottom, left:right] = 255
    return Image.fromarray(pixels)


def cells(box: tuple[int, int, int, int], cell_w: float, cell_h: float) -> set[tuple[float, ...]]:
    """The cells, in the original's pixels, that a rectangle aligned to them covers: what the detector finds."""
    left, top, right, bottom = box
    return {(x, y, x + cell_w, y + cell_h) for x in np.arange(left, right, cell_w).tolist()
            for y in np.arange(top, bottom, cell_h).tolist()}


ROTATIONS = {1: None, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}


def encode(image: Image.Image, fmt: str, orientation: int = 1) -> bytes:
    """The file a camera would write for what a viewer shows as `image`: stored turned, with its EXIF orientation."""
    turn = ROTATIONS[orientation]
    stored = image if turn is None else image.transpose(turn)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    out = io.BytesIO()
    stored.save(out, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    data = out.getvalue()
    assert np.array_equal(np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
                          [::8, ::8] > 127, np.asarray(image)[::8, ::8] > 127)  # the viewer's image, as meant
    return data


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny detector in every order and feed, stretched and letterboxed, and one imported with labels with gaps,
    served on cpu and emulated over a real socket."""
    root = tmp_path_factory.mktemp("detectors")
    for order in OUTPUT_ORDERS:
        for feed in FEEDS:
            detector_dir(root, f"tiny_{order}_{feed}", tiny_detector(order=order, feed=feed), order)
    detector_dir(root, "tiny_letterbox", tiny_detector(order="tf2"), "tf2", "letterbox")
    source = root.parent / "tiny_gaps.tflite"
    source.write_bytes(tiny_detector(order="tf2", num_classes=4))
    labels = root.parent / "coco_style_labels.txt"
    labels.write_text("0  square\n3  circle\n")  # Coral's `id label` lines: ids 1 and 2 have no label
    import_model([source], ImportOptions(name="tiny_gaps", out=root, labels=labels, mean=[0.0], std=[255.0]))
    settings = Settings(model_dir=root, backends=["cpu", "emulated"], workers=1,
                        default_detection_model="tiny_tf1_dequantize", max_waiting=0, retry_after_s=2)
    with served(settings) as (app, url), httpx.Client(base_url=url, timeout=60) as client:
        yield app, client


def detect(client: httpx.Client, model: str, data: bytes, **params) -> dict:
    r = client.post(f"/v1/models/{model}/detect", params={"min_score": 0.3, **params}, content=data,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    return r.json()


def boxes_of(answer: dict) -> set[tuple[float, ...]]:
    return {tuple(d["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")) for d in answer["detections"]}


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_every_exporters_order_and_feed_loads_and_gives_the_same_boxes(tiny):
    _, client = tiny
    image = png(rectangle(SIZE, SIZE, (8, 4, 16, 12)))
    answers = {(order, feed, backend): detect(client, f"tiny_{order}_{feed}", image, backend=backend)
               for order in OUTPUT_ORDERS for feed in FEEDS for backend in ("cpu", "emulated")}
    first = answers["tf1", "dequantize", "cpu"]
    assert boxes_of(first) == cells((8, 4, 16, 12), 4, 4)
    assert {(d["label"], d["class_id"]) for d in first["detections"]} == {("square", 0)}
    assert first["image"] == {"width": SIZE, "height": SIZE}
    for key, answer in answers.items():
        assert answer["detections"] == first["detections"], key
        assert {"decode", "preprocess", "queue", "inference", "postprocess", "total"} <= set(answer["timing_ms"])
        assert answer["cold"] is False and answer["warmup"]["load_ms"] > 0
    scores = [d["score"] for d in first["detections"]]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0.3
    for d in first["detections"]:  # normalized: the same box over the original's size
        assert d["box_normalized"]["x_max"] == d["box"]["x_max"] / SIZE


def test_v2_answers_a_detectors_named_outputs_in_role_order_whatever_the_graphs(tiny):
    _, client = tiny
    pixels = np.asarray(rectangle(SIZE, SIZE, (8, 4, 16, 12)))
    results = {}
    for order in OUTPUT_ORDERS:
        name = f"tiny_{order}_dequantize"
        meta = client.get(f"/v2/models/{name}").json()
        assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
            ("boxes", "FP32", [-1, 10, 4]), ("classes", "FP32", [-1, 10]), ("scores", "FP32", [-1, 10]),
            ("count", "FP32", [-1, 1])]
        r = client.post(f"/v2/models/{name}/infer", json={"inputs": [{
            "name": "image", "shape": [1, SIZE, SIZE, 3], "datatype": "UINT8", "data": pixels.reshape(-1).tolist()}]})
        assert r.status_code == 200, r.text
        results[order] = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert results["tf1"] == results["tf2"]
    assert results["tf1"]["count"] == [4.0]
    native = detect(client, "tiny_tf2_dequantize", png(Image.fromarray(pixels)))
    boxes = np.asarray(results["tf1"]["boxes"]).reshape(-1, 4)[:4] * SIZE  # ymin, xmin, ymax, xmax
    assert {(b[1], b[0], b[3], b[2]) for b in boxes.tolist()} == boxes_of(native)


# Each case: the model's resize, the viewer's image size, the white rectangle, the expected cells (w, h) in the
# original's pixels, the DCT scale a JPEG of it is decoded at. Stretch: a 16x16 input cell is W/4 x H/4; letterbox
# fits the width (16 of 16) and half the height (8 of 16), so a cell is W/4 x H/2 and the padding below finds nothing.
GEOMETRIES = {
    "stretch": ("tiny_tf1_dequantize", (64, 32), (32, 8, 64, 24), (16, 8), 2),
    "letterbox": ("tiny_letterbox", (64, 32), (32, 0, 64, 32), (16, 16), 4),
    "stretch, large": ("tiny_tf1_dequantize", (512, 256), (256, 64, 512, 192), (128, 64), 8),
    "letterbox, large": ("tiny_letterbox", (512, 256), (256, 0, 512, 256), (128, 128), 8),
}


@pytest.mark.parametrize("orientation", [1, 6, 8, 3])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("case", GEOMETRIES)
def test_boxes_map_back_to_the_original_pixels_exactly(tiny, case, fmt, orientation):
    _, client = tiny
    model, (width, height), box, (cell_w, cell_h), jpeg_scale = GEOMETRIES[case]
    data = encode(rectangle(width, height, box), fmt, orientation)
    spec = read_model_dir(service_of(tiny[0]).settings.model_dir / model).manifest.input
    image, source = decode_with_source(data, spec, 10**8)
    assert (source.width, source.height) == (width, height)  # as a viewer shows it, whatever the file stores
    assert source.scale == (jpeg_scale if fmt == "JPEG" else 1)  # a JPEG's DCT draft: 1/s of each side decoded
    answer = detect(client, model, data)
    assert answer["image"] == {"width": width, "height": height}
    assert boxes_of(answer) == cells(box, cell_w, cell_h)


def test_labels_with_gaps_name_the_right_classes(tiny):
    _, client = tiny
    model_dir = read_model_dir(service_of(tiny[0]).settings.model_dir / "tiny_gaps")
    assert model_dir.labels == ("square", "", "", "circle")  # line i names class id i; blank: no label
    answer = detect(client, "tiny_gaps", png(rectangle(SIZE, SIZE, (0, 0, 8, 8))))
    assert {d["label"] for d in answer["detections"]} == {"square"}
    # the op's class ids 0, 1, 3 through the same post-processing: a blank line is named by its id
    labels = parse_labels("0 square\n3 circle\n").by_id
    lines = tuple(labels.get(i, "") for i in range(4))
    roles = OutputRoles({"boxes": 0, "classes": 1, "scores": 2, "count": 3}, {})
    outputs = [np.array([[[0, 0, .5, .5], [.5, .5, 1, 1], [0, .5, .5, 1]]], np.float32),
               np.array([[0, 3, 1]], np.float32), np.array([[.9, .8, .7]], np.float32), np.array([3], np.float32)]
    found = objects(roles, outputs, Geometry(100, 50, (0, 0, 100, 50), (1, 1)), lines, 0.5)
    assert [(o.label, o.class_id, o.box.x_max, o.box.y_max) for o in found] == [
        ("square", 0, 50, 25), ("circle", 3, 100, 50), ("1", 1, 100, 25)]
    only = objects(roles, outputs, Geometry(100, 50, (0, 0, 100, 50), (1, 1)), lines, 0.5, wanted=frozenset({3}))
    assert [o.label for o in only] == ["circle"]


def test_max_detections_and_the_labels_filter(tiny):
    _, client = tiny
    image = png(rectangle(SIZE, SIZE, (8, 4, 16, 12)))
    assert len(detect(client, "tiny_gaps", image, max_detections=2)["detections"]) == 2
    assert len(detect(client, "tiny_gaps", image, labels="square,circle")["detections"]) == 4
    assert detect(client, "tiny_gaps", image, labels="circle")["detections"] == []
    assert len(detect(client, "tiny_gaps", image, labels="0")["detections"]) == 4  # a class by its id
    r = client.post("/v1/models/tiny_gaps/detect?labels=person", content=image)
    assert r.status_code == 400 and r.json()["error"] == ("labels: model 'tiny_gaps' has no label person; its labels: "
                                                          "square, circle")


def test_a_full_line_is_refused_in_each_protocols_shape(tiny):
    app, client = tiny
    registry = service_of(app).registry
    routes = InferenceRoutes.of(inference_routers())
    check = HeadAdmission(service_of(app).core, routes)
    place = registry.get("tiny_tf1_dequantize").pool("cpu").admit()  # the line of 1 is full
    try:
        assert check(b"POST", b"/v1/detect").fields == {}
        assert check(b"POST", b"/v1/vision/detection").fields == {"success": False, "duration": 0}
        assert check(b"POST", b"/v1/vision/custom/tiny_tf1_dequantize?backend=cpu").status == 503
        # from the application (the head check is the server's: here the lease refuses with the same words)
        image = png(rectangle(SIZE, SIZE, (8, 4, 16, 12)))
        native = client.post("/v1/detect", content=image)
        deepstack = client.post("/v1/vision/detection", files={"image": image})
    finally:
        place.release()
    assert native.status_code == deepstack.status_code == 503
    assert deepstack.headers["retry-after"] == "2" and native.json()["error"] == deepstack.json()["error"]
    assert deepstack.json() == {"success": False, "error": native.json()["error"], "duration": 0}


# ---- the committed person detector, served as `make serve` serves it ------------------------------------------

@pytest.fixture(scope="module")
def people():
    """models/ as `make serve` finds it (the classifiers and the person detector, no setting), on cpu, with a key."""
    settings = Settings(model_dir=MODELS, backends=["cpu", "emulated"], workers=1, api_keys=[KEY])
    with served(settings) as (app, url), httpx.Client(base_url=url, timeout=60, headers=AUTH) as client:
        yield app, url, client


def tflite_boxes(photo: Path) -> list[tuple[float, ...]]:
    """TFLite's own interpreter on the same pixels: the boxes scoring 0.5 or more, in the photo's pixels."""
    from ai_edge_litert.interpreter import Interpreter

    model_dir = read_model_dir(MODELS / DETECTOR)
    spec = model_dir.manifest.input
    interpreter = Interpreter(model_path=str(model_dir.file("int8")))
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    index = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    image = decode(photo.read_bytes(), spec, 10**8)
    quantize = InputQuantizer(spec, inp["dtype"], *inp["quantization"])
    interpreter.set_tensor(inp["index"], quantize(to_pixels(image, spec)))
    interpreter.invoke()
    out = {role: interpreter.get_tensor(index[name])[0] for role, name in model_dir.manifest.outputs.items()}
    count = int(out["count"].reshape(-1)[0])
    width, height = image.size
    return [(b[1] * width, b[0] * height, b[3] * width, b[2] * height)
            for b, s in zip(out["boxes"][:count], out["scores"][:count]) if s >= 0.5]


def test_make_serve_serves_the_classifiers_and_the_person_detector_side_by_side(people):
    app, _, client = people
    listing = client.get("/v1/models").json()
    assert listing["default_model"] == "efficientnet_lite0" and listing["default_detection_model"] == DETECTOR
    by_name = {m["name"]: m for m in listing["models"]}
    assert by_name[DETECTOR]["task"] == "detection" and by_name[DETECTOR]["default"] is True
    assert by_name["efficientnet_lite0"]["task"] == "classification"
    assert all(m["state"] == "ready" for m in listing["models"])


def test_the_default_detector_finds_the_people_as_tflite_does(people):
    _, _, client = people
    photos = {p.name: p for p in people_photos()}
    for name, expected in PEOPLE.items():
        r = client.post("/v1/detect", files={"image": photos[name].read_bytes()})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["model"] == DETECTOR and answer["backend"] == "cpu"
        served_boxes = [tuple(d["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")) for d in answer["detections"]]
        assert {d["label"] for d in answer["detections"]} == {"person"}
        reference = tflite_boxes(photos[name])
        assert len(served_boxes) == len(reference) == len(expected), (name, served_boxes, reference)
        for box, ref in zip(served_boxes, reference):  # best first in both; clipped to the photo here
            width, height = answer["image"]["width"], answer["image"]["height"]
            clipped = (min(max(ref[0], 0), width), min(max(ref[1], 0), height),
                       min(max(ref[2], 0), width), min(max(ref[3], 0), height))
            assert np.allclose(box, clipped, atol=1.0), (name, box, ref)
        for person in expected:  # the people the float graph finds, checked by eye
            assert max(pixel_iou(person, box) for box in served_boxes) >= 0.85, (name, person, served_boxes)


def test_on_emulated_the_default_detectors_outputs_are_tflites_reference_kernels_byte_for_byte(people):
    """The served tensors (OIP v2, named by role) and the served boxes, from the emulator, against BUILTIN_REF run on
    the same pixels: the same bytes, and so the same boxes to the last bit."""
    from app.tflite_file import read_tflite
    from tests.reference_worker import ReferenceWorker

    _, _, client = people
    model_dir = read_model_dir(MODELS / DETECTOR)
    spec = model_dir.manifest.input
    model = model_dir.file("int8").read_bytes()
    graph = read_tflite(model).graph
    names = [graph.tensors[i].name for i in graph.outputs]
    position = {role: names.index(name) for role, name in model_dir.manifest.outputs.items()}
    roles = OutputRoles(position, {})
    quantization = model_dir.manifest.quantization.input
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        for photo in people_photos():
            data = photo.read_bytes()
            image, source = decode_with_source(data, spec, 10**8)
            quantize = InputQuantizer(spec, np.uint8, quantization.scale, quantization.zero_point)
            reference = worker.run(model, [quantize(to_pixels(image, spec))])
            r = client.post(f"/v2/models/{DETECTOR}/infer", json={
                "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"content_type": "base64"},
                            "data": [__import__("base64").b64encode(data).decode()]}],
                "parameters": {"backend": "emulated"}})
            assert r.status_code == 200, r.text
            served = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
            count = int(reference[position["count"]].reshape(-1)[0])
            assert served["count"].tobytes() == reference[position["count"]].tobytes()
            for role in ("boxes", "classes", "scores"):  # rows past `count` are the kernel's stale memory (fast NMS)
                want = reference[position[role]].reshape(served[role].shape)[:count]
                assert served[role][:count].tobytes() == want.tobytes(), (photo.name, role)
            answer = detect(client, DETECTOR, data, backend="emulated", min_score=0.5)
            expected = objects(roles, reference, Geometry.of(source, image.size, spec), model_dir.labels, 0.5)
            assert answer["backend"] == "emulated"
            assert boxes_of(answer) == {(o.box.x_min, o.box.y_min, o.box.x_max, o.box.y_max) for o in expected}
            assert len(answer["detections"]) == len(PEOPLE[photo.name])
    finally:
        worker.close()


def test_deepstacks_route_answers_as_deepstack_and_codeproject_do(people):
    _, _, client = people
    photo = next(p for p in people_photos() if p.name == "basketball1.png")
    native = client.post("/v1/detect?min_score=0.45", files={"image": photo.read_bytes()}).json()
    r = client.post("/v1/vision/detection", files={"image": photo.read_bytes()}, headers={"Authorization": ""},
                    data={"api_key": KEY})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["success"] is True and answer["count"] == 2 and answer["message"] == "Found person, person"
    for prediction, d in zip(answer["predictions"], native["detections"]):
        assert prediction["label"] == "person" and prediction["confidence"] == d["score"]
        for key in ("x_min", "y_min", "x_max", "y_max"):
            assert isinstance(prediction[key], int) and abs(prediction[key] - d["box"][key]) <= 0.5
    assert set(answer) == {"success", "predictions", "duration", "message", "count", "inferenceMs", "processMs",
                           "analysisRoundTripMs", "moduleId", "moduleName", "command", "executionProvider",
                           "timestampUTC"}
    assert answer["command"] == "detect" and answer["executionProvider"] == "CPU"
    assert {key: p.execution_provider for key, p in BACKENDS.items()} == {"cpu": "CPU", "emulated": "CPU", "edgetpu": "TPU"}
    assert answer["timestampUTC"].endswith(" GMT")
    custom = client.post(f"/v1/vision/custom/{DETECTOR}", files={"image": photo.read_bytes()},
                         data={"min_confidence": "0.99"}).json()
    assert custom["success"] is True and custom["command"] == "custom" and custom["predictions"] == []
    assert custom["message"] == "No objects found"


def test_a_deepstack_client_library_gets_boxes(people):
    """deepstack-python from PyPI, unchanged, over a real socket: the key and min_confidence as its form fields."""
    _, url, _ = people
    python = ensure_venv("deepstack", ["deepstack-python==0.9"], share=True)
    host, port = url.removeprefix("http://").split(":")
    photo = next(p for p in people_photos() if p.name == "basketball1.png")
    for custom in ("", DETECTOR):
        out = subprocess.run([str(python), str(CLIENT_SCRIPT), host, port, str(photo), KEY, custom],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert "error" not in result, result
        assert result["summary"] == {"person": 2}
        assert sorted((p["x_min"], p["y_min"]) for p in result["predictions"]) == [(29, 83), (437, 18)]
        assert result["wrong_key"] == "Error from Deepstack request, status code: 401"


def test_bad_input_on_the_detection_routes_is_a_4xx_with_json(people, china_jpg):
    _, _, client = people
    good = china_jpg.read_bytes()
    native = [
        ("/v1/detect", {"content": b""}, 400),
        ("/v1/detect", {"content": b"not an image"}, 400),
        ("/v1/detect", {"content": good[: len(good) // 2]}, 400),
        ("/v1/detect", {"content": b"x", "headers": {"content-type": "text/plain"}}, 415),
        ("/v1/detect?min_score=2", {"content": good}, 422),
        ("/v1/detect?min_score=nan", {"content": good}, 422),
        ("/v1/detect?max_detections=0", {"content": good}, 422),
        ("/v1/detect?backend=gpu", {"content": good}, 422),
        ("/v1/models/efficientnet_lite0/detect", {"content": good}, 400),
        ("/v1/models/nope/detect", {"content": good}, 404),
        ("/v1/detect", {"files": {"picture": good}}, 400),
        ("/v1/detect", {"content": good, "headers": {"Authorization": "Bearer wrong"}}, 401),
    ]
    for path, request, status in native:
        r = client.post(path, **request)
        assert r.status_code == status, (path, r.status_code, r.text)
        assert set(r.json()) == {"error"}, (path, r.text)
    deepstack = [
        ("/v1/vision/detection", {"files": {"image": b""}}, 400),
        ("/v1/vision/detection", {"files": {"image": b"GIF89a broken"}}, 400),
        ("/v1/vision/detection", {"files": {"picture": good}}, 400),
        ("/v1/vision/detection", {"files": {"image": good}, "data": {"min_confidence": "abc"}}, 400),
        ("/v1/vision/detection", {"files": {"image": good}, "data": {"min_confidence": "1.5"}}, 400),
        ("/v1/vision/detection", {"content": b"x", "headers": {"content-type": "text/plain"}}, 400),
        ("/v1/vision/detection?backend=gpu", {"files": {"image": good}}, 400),
        ("/v1/vision/custom/nope", {"files": {"image": good}}, 404),
        ("/v1/vision/custom/efficientnet_lite0", {"files": {"image": good}}, 400),
        ("/v1/vision/detection", {"files": {"image": good}, "headers": {"Authorization": ""}}, 401),
        ("/v1/vision/detection", {"files": {"image": good}, "data": {"api_key": "wrong"},
                                  "headers": {"Authorization": ""}}, 401),
        ("/v1/vision/detection", {"files": {"image": good}, "headers": {"Authorization": "Bearer wrong"}}, 401),
        ("/v1/vision/detection", {"content": b"--x\r\nbroken", "headers": {
            "content-type": "multipart/form-data; boundary=x"}}, 400),
    ]
    for path, request, status in deepstack:
        r = client.post(path, **request)
        assert r.status_code == status, (path, request.get("data"), r.status_code, r.text)
        body = r.json()
        assert body["success"] is False and body["error"] and set(body) == {"success", "error", "duration"}, r.text
    port = int(client.base_url.port)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # declared too large: refused unread
        sock.sendall(f"POST /v1/vision/detection HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: image/jpeg\r\nContent-Length: {10**9}\r\n\r\n".encode())
        status, _, body = read_response(sock)
    assert status == 413 and body["success"] is False and "limit" in body["error"]


def test_the_metrics_say_which_task(people, cat_png):
    _, _, client = people
    from tests.test_metrics import scrape, value

    before = scrape(client)
    assert client.post("/v1/detect", content=cat_png.read_bytes()).status_code == 200
    assert client.post("/v1/vision/detection", files={"image": cat_png.read_bytes()}).status_code == 200
    assert client.post("/v1/classify", content=cat_png.read_bytes()).status_code == 200
    after = scrape(client)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    detector = {"task": "detection", "model": DETECTOR, "backend": "cpu"}
    assert moved("edgetpu_serve_requests_total", protocol="v1", status="200", **detector) == 1
    assert moved("edgetpu_serve_requests_total", protocol="deepstack", status="200", **detector) == 1
    assert moved("edgetpu_serve_requests_total", protocol="v1", status="200", task="classification",
                 model="efficientnet_lite0", backend="cpu") == 1
    assert moved("edgetpu_serve_stage_seconds_count", stage="postprocess", **detector) == 2


def test_a_detector_with_other_outputs_is_refused_at_load_saying_what_it_has():
    """The registry binds the task's roles when it loads a version: a ModelDirError there fails the model's load."""
    from app.engines import TensorSpec
    from app.errors import ModelDirError
    from app.model_dir.reading import ModelDir
    from app.model_dir.schema import Manifest
    from app.tasks.detect import TASK

    names = {"boxes": "features", "classes": "pooled", "scores": "features", "count": "pooled"}
    manifest = Manifest.model_validate({"name": "not_a_detector", "task": "detection", "source": "test",
                                        "licence": "MIT", "outputs": names,
                                        "input": {"width": 2, "height": 2, "mean": [0], "std": [1]}})
    uint8 = np.dtype(np.uint8)
    outputs = (TensorSpec("features", (1, 12), uint8, 0.1, 0), TensorSpec("pooled", (1, 1, 1, 3), uint8, 0.1, 0))
    with pytest.raises(ModelDirError) as refused:
        TASK.bind(ModelDir(Path("not_a_detector"), manifest, ()), outputs)
    assert str(refused.value) == (
        "model 'not_a_detector' (detection): a detector's outputs are TFLite_Detection_PostProcess's, float32 "
        "boxes [1, N, 4], classes [1, N], scores [1, N] and count [1]; model.json `outputs` names boxes "
        "'features' uint8 [1, 12], classes 'pooled' uint8 [1, 1, 1, 3], scores 'features' uint8 [1, 12], count "
        "'pooled' uint8 [1, 1, 1, 3] (wrong: boxes, classes, scores, count)")


def test_geometry_of_a_draft_decoded_jpeg_uses_the_true_size():
    """641 x 480 at 1/2: 321 decoded columns stand for 641 original ones, each for 2: the last half-covered."""
    geometry = Geometry.of(Source(641, 480, 2), (321, 240), read_model_dir(MODELS / DETECTOR).manifest.input)
    x, y = geometry.to_original(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.5, 1.0]))
    assert x.tolist() == [0.0, 321.0, 642.0] and y.tolist() == [0.0, 240.0, 480.0]
    assert (geometry.width, geometry.height) == (641, 480)  # boxes are clipped to this


# ---- the YOLO decoders through the task (app/tasks/yolo.py; served: tests/test_detection_families_serving.py) ------

def _yolo_model_dir(detection: dict, outputs: dict):
    from app.model_dir.reading import ModelDir
    from app.model_dir.schema import Manifest

    manifest = Manifest.model_validate({"name": "head", "task": "detection", "source": "test", "licence": "MIT",
                                        "outputs": outputs, "detection": detection,
                                        "input": {"width": 64, "height": 64, "resize": "letterbox", "mean": [0],
                                                  "std": [255]}})
    return ModelDir(Path("head"), manifest, ("red", "green", "blue"))


DFL = {"decoder": "yolo_dfl", "classes": 3}
DFL_OUTPUTS = {"class_logits": "logits", "box_distributions": "bins"}


def _dfl_specs(n: int = 84, classes: int = 3, bins: int = 64):
    from app.engines import TensorSpec

    int8 = np.dtype(np.int8)
    return (TensorSpec("bins", (1, n, bins), int8, 0.5, 0), TensorSpec("logits", (1, n, classes), int8, 0.1, 0))


def test_a_yolo_models_roles_are_its_decoders_bound_by_name_with_decoded_named_outputs():
    from app.tasks.detect import TASK

    roles = TASK.bind(_yolo_model_dir(DFL, DFL_OUTPUTS), _dfl_specs())
    assert dict(roles.index) == {"class_logits": 1, "box_distributions": 0}
    assert [(o.name, o.shape, o.dtype.name) for o in roles.named] == [
        ("boxes", (100, 4), "float32"), ("classes", (100,), "float32"), ("scores", (100,), "float32"),
        ("count", (1,), "float32")]


def test_a_yolo_model_whose_tensors_do_not_fit_is_refused_at_load_saying_what_fits():
    from app.errors import ModelDirError
    from app.tasks.detect import TASK

    with pytest.raises(ModelDirError) as refused:
        TASK.bind(_yolo_model_dir(DFL, DFL_OUTPUTS), _dfl_specs(n=80))
    assert "decoder 'yolo_dfl'" in str(refused.value) and "class_logits must be [1, 84, 3]" in str(refused.value)
    one = {"decoder": "yolo", "classes": 3, "layout": "attributes_first", "box_scale": "normalized"}
    from app.engines import TensorSpec

    with pytest.raises(ModelDirError, match=r"predictions must be \[1, A, N\] with A = 7"):
        TASK.bind(_yolo_model_dir(one, {"predictions": "out"}),
                  (TensorSpec("out", (1, 84, 7), np.dtype(np.int8), 1 / 255, -128),))
    with pytest.raises(ModelDirError, match="must name its 'class_logits' output in `outputs`"):
        TASK.bind(_yolo_model_dir(DFL, {}), _dfl_specs())  # no names: by position never


def test_the_task_reads_a_yolo_head_with_the_models_thresholds_unless_the_request_gives_its_own():
    """Peaked DFL bins put three boxes where they were put (tests/test_yolo.py's known boxes); min_score None is
    model.json's, a class filter comes after NMS, max_detections caps."""
    from app.tasks import Outputs
    from app.tasks.detect import TASK, DetectOptions

    n = 84
    logits = np.full((1, n, 3), -100, np.int8)  # scale 0.1: -10
    bins = np.zeros((1, n, 4, 16), np.int8)
    for anchor, label, logit, side in ((9, 0, 20, 1), (64 + 5, 1, 3, 1), (80 + 3, 2, 30, 1)):
        logits[0, anchor, label] = logit      # 2.0 (0.88), 0.3 (0.57), 3.0 (0.95)
        bins[0, anchor, :, side] = 120        # scale 0.5: 60
    model_dir = _yolo_model_dir({**DFL, "min_score": 0.6}, DFL_OUTPUTS)
    specs = _dfl_specs()
    roles = TASK.bind(model_dir, specs)
    outputs = Outputs([bins.reshape(1, n, 64), logits], roles, model_dir, Geometry.identity(64, 64))
    found = TASK.read(outputs, DetectOptions()).detections
    assert [o.label for o in found] == ["blue", "red"]  # green's 0.57 is under the model's 0.6
    assert [round(o.score, 3) for o in found] == [0.953, 0.881]
    assert (found[1].box.x_min, found[1].box.y_min, found[1].box.x_max, found[1].box.y_max) == pytest.approx(
        (4, 4, 20, 20), abs=1e-6)
    assert [o.label for o in TASK.read(outputs, DetectOptions(min_score=0.5)).detections] == ["blue", "red", "green"]
    assert len(TASK.read(outputs, DetectOptions(min_score=0.5, max_detections=2)).detections) == 2
    only = TASK.read(outputs, DetectOptions(0.5, 1, class_ids=frozenset({1}))).detections
    assert [o.label for o in only] == ["green"]
    named = TASK.named_values(outputs)  # OIP v2: the rows at the model's thresholds, zeros after them
    assert named["count"].tolist() == [2.0] and named["classes"][:3].tolist() == [2.0, 0.0, 0.0]
    assert named["boxes"].shape == (100, 4) and not named["boxes"][2:].any()
