"""An Ultralytics export served as `yolo predict` sees it, on `cpu` and `emulated`, through every image door.

The model is tests/yolo_models.py's Ultralytics-like head (one tensor [1, 7, 84], boxes as fractions of the input,
sigmoid class scores), calibrated as Ultralytics' own 8.2.23 and 8.3.82 exports were: on inputs normalized to
ImageNet's range, so its int8 input is quantized (0.018658, -14), about [-2.13, 2.63], though its maker feeds it
pixels / 255. It carries Ultralytics' 8.2 metadata (temp_meta.txt, a dict's repr with int keys), from which
`converter import` takes its maker's convention.

The reference is Ultralytics' pipeline written here, independent of app/: Pillow's decode and bilinear resize,
LetterBox(center=True) on grey 114, pixels / 255 in float32 quantized as AutoBackend does ((x / scale +
zero_point).astype(int8)), the interpreter (TFLite's XNNPACK kernels for cpu, its reference kernels for emulated,
which the emulator reproduces byte for byte), the output dequantized and scaled to the input's pixels, the best
class over 0.25, class-aware greedy NMS at IoU 0.45, scale_boxes back to the image, clipped. The service's answers
on /v1, DeepStack's, DOODS' and OIP v2's doors equal it: the same objects, scores to the float, boxes to 1e-3 px.

A JPEG is decoded whole, as the reference decodes it, up to EDGETPU_SERVE_MAX_DECODED_PIXELS; beyond, at the least
DCT reduction under it, which is not the reference's pixels: there the objects are the same by the issue's measure
(label, IoU >= 0.8, score within 0.1).
"""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from converter.importer import ImportOptions, import_model
from tests import yolo_models
from tests.conftest import Service
from tests.reference_worker import ReferenceWorker

pytestmark = pytest.mark.slow

NAME = "yolo"
CLASSES = list(yolo_models.CLASSES)
SIDE = yolo_models.SIZE
MIN_SCORE, NMS_IOU = 0.25, 0.45
BACKENDS = ("cpu", "emulated")
MAX_DECODED_PIXELS = 200_000  # the service's limit here: a 640 x 400 JPEG is decoded at 1/2


def scene(width: int, height: int) -> np.ndarray:
    """Black, with a red square and a green one where the letterbox puts them on the head's grid cells (r = 0.5 for
    these sizes): red 16 x 16 at (0, 8), green 32 x 32 at (64, 40)."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[8:24, 0:16, 0] = 255
    pixels[40:72, 64:96, 1] = 255
    return pixels


def encoded(pixels: np.ndarray, fmt: str = "PNG", **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **options)
    return out.getvalue()


# (name, image bytes): odd padding below (128 x 78: 39 rows, 12 above, 13 below), even (128 x 80), at the sides
# (78 x 128: transposed), JPEGs (Coral's convention would decode the 512 x 320 one at 1/8 in the DCT)
IMAGES = {
    "128x80": encoded(scene(128, 80)),
    "128x78": encoded(scene(128, 78)),
    "78x128": encoded(np.ascontiguousarray(scene(128, 78).transpose(1, 0, 2))),
    "jpeg 100x61": encoded(scene(128, 80)[:61, :100], "JPEG", quality=95),
    "jpeg 512x320": encoded(np.kron(scene(128, 80), np.ones((4, 4, 1), np.uint8)), "JPEG", quality=92),
}


# ---- Ultralytics' pipeline, written from its code's steps ---------------------------------------------------------

def letterbox(image: Image.Image) -> tuple[np.ndarray, float, int, int]:
    """LetterBox(new_shape=(64, 64), center=True): ratio, rounded unpadded size, the padding split in two (the odd
    pixel below or right), grey 114."""
    w, h = image.size
    r = min(SIDE / h, SIDE / w)
    nw, nh = int(round(w * r)), int(round(h * r))
    left, top = int(round((SIDE - nw) / 2 - 0.1)), int(round((SIDE - nh) / 2 - 0.1))
    canvas = np.full((SIDE, SIDE, 3), 114, np.uint8)
    canvas[top:top + nh, left:left + nw] = np.asarray(image.resize((nw, nh), Image.Resampling.BILINEAR))
    return canvas, r, left, top


def input_tensor(canvas: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """AutoBackend: im / 255 in float32, then (im / scale + zero_point).astype(int8)."""
    im = canvas[None].astype(np.float32) / np.float32(255)
    return (im / np.float32(scale) + np.float32(zero_point)).astype(np.int8)


def greedy_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> list[int]:
    """torchvision.ops.nms over boxes offset by class: best first, suppressing IoU > NMS_IOU within a class."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    kept: list[int] = []
    for i in order:
        if all(classes[i] != classes[k] or iou(boxes[i], boxes[k]) <= NMS_IOU for k in kept):
            kept.append(i)
    return kept


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


class Reference:
    """Ultralytics' predictor on the model's file, the interpreter being TFLite's (XNNPACK) or its reference
    kernels (what `emulated` reproduces)."""

    def __init__(self, data: bytes):
        from ai_edge_litert.interpreter import Interpreter

        self.data = data
        self.interpreter = Interpreter(model_content=data, num_threads=1)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self.worker = ReferenceWorker("BUILTIN_REF")

    def run(self, backend: str, tensor: np.ndarray) -> np.ndarray:
        if backend == "emulated":
            return self.worker.run(self.data, [tensor])[0]
        self.interpreter.set_tensor(self.input["index"], tensor)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"]).copy()

    def predict(self, data: bytes, backend: str) -> dict:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        canvas, r, left, top = letterbox(image)
        raw = self.run(backend, input_tensor(canvas, *self.input["quantization"]))
        scale, zero_point = self.output["quantization"]
        y = (raw.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
        y[:, [0, 2]] *= np.float32(SIDE)                  # xywh normalized by the export: back to input pixels
        y[:, [1, 3]] *= np.float32(SIDE)
        pred = y[0].T                                     # [84, 4 + C]
        conf, cls = pred[:, 4:].max(1), pred[:, 4:].argmax(1)
        keep = np.flatnonzero(conf > MIN_SCORE)
        xywh = pred[keep, :4]
        xyxy = np.stack([xywh[:, 0] - xywh[:, 2] / 2, xywh[:, 1] - xywh[:, 3] / 2,
                         xywh[:, 0] + xywh[:, 2] / 2, xywh[:, 1] + xywh[:, 3] / 2], axis=1)
        kept = greedy_nms(xyxy, conf[keep], cls[keep])
        w, h = image.size
        found = []
        for i in kept:
            x1, y1, x2, y2 = ((xyxy[i] - [left, top, left, top]) / r).tolist()   # scale_boxes
            box = [min(max(x1, 0), w), min(max(y1, 0), h), min(max(x2, 0), w), min(max(y2, 0), h)]
            found.append({"label": CLASSES[int(cls[keep][i])], "score": float(conf[keep][i]), "box": box,
                          "input_box": (xyxy[i] / SIDE).tolist()})
        return {"width": w, "height": h, "objects": found}

    def close(self):
        self.worker.close()


# ---- the service ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("ultralytics")
    data = yolo_models.with_ultralytics_metadata(
        yolo_models.ultralytics_like(calibrated_over=yolo_models.IMAGENET_RANGE),
        yolo_models.ultralytics_metadata(CLASSES, version="8.2.23"), form="literal")
    source = root / "yolov8n_full_integer_quant.tflite"
    source.write_bytes(data)
    import_model([source], ImportOptions(name=NAME, out=root / "models"))
    env = {"EDGETPU_SERVE_MODEL_DIR": str(root / "models"), "EDGETPU_SERVE_BACKENDS": ",".join(BACKENDS),
           "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": NAME, "EDGETPU_SERVE_WORKERS": "1",
           "EDGETPU_SERVE_MAX_DECODED_PIXELS": str(MAX_DECODED_PIXELS)}
    reference = Reference(data)
    try:
        with Service(env, inherit_settings=False) as service, \
                httpx.Client(base_url=service.url, timeout=60) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 200, (ready.text, service.output()[-3000:])
            yield root / "models" / NAME, client, reference
    finally:
        reference.close()


def native(client, data: bytes, backend: str) -> dict:
    r = client.post(f"/v1/models/{NAME}/detect", params={"backend": backend, "min_score": MIN_SCORE},
                    files={"image": data})
    assert r.status_code == 200, r.text
    return r.json()


def corners(box: dict) -> list[float]:
    return [box["x_min"], box["y_min"], box["x_max"], box["y_max"]]


def test_the_import_takes_ultralytics_convention_from_its_metadata(served):
    from app.model_dir.reading import read_model_dir

    directory, _, reference = served
    spec = read_model_dir(directory).manifest.input
    scale, zero_point = reference.input["quantization"]
    assert (round(scale, 6), zero_point) == (0.018658, -14)           # the export's artefact: about [-2.13, 2.63]
    assert (spec.mean, spec.std, spec.resize) == ([0.0], [255.0], "letterbox")
    assert spec.convention.name == "ultralytics" and "temp_meta.txt" in spec.convention.why


@pytest.mark.parametrize("image", list(IMAGES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_v1_answers_as_ultralytics_pipeline_does(served, image, backend):
    _, client, reference = served
    data = IMAGES[image]
    expected = reference.predict(data, backend)
    answer = native(client, data, backend)
    assert answer["backend"] == backend
    assert answer["image"] == {"width": expected["width"], "height": expected["height"]}
    found = answer["detections"]
    assert [d["label"] for d in found] == [o["label"] for o in expected["objects"]], (found, expected)
    assert "red" in {d["label"] for d in found}                         # not an empty agreement
    for d, o in zip(found, expected["objects"]):
        assert d["score"] == pytest.approx(o["score"], abs=1e-6)
        assert corners(d["box"]) == pytest.approx(o["box"], abs=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_image_door_feeds_it_the_same(served, backend):
    """DeepStack's, DOODS' and OIP v2's image doors: the same objects as /v1 (OIP v2: the decoded rows, in the
    input's fractions, as the reference has them before scale_boxes)."""
    _, client, reference = served
    data = IMAGES["128x78"]
    answer = native(client, data, backend)["detections"]
    r = client.post(f"/v1/vision/custom/{NAME}", params={"backend": backend}, files={"image": data},
                    data={"min_confidence": str(MIN_SCORE)})
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert [(p["label"], p["x_min"], p["y_min"], p["x_max"], p["y_max"]) for p in predictions] == \
        [(d["label"], *(int(v + 0.5) for v in corners(d["box"]))) for d in answer]
    if backend == "cpu":  # DOODS names no backend: the model's first
        r = client.post("/detect", json={"data": base64.b64encode(data).decode(), "detector_name": NAME,
                                         "detect": {"*": MIN_SCORE * 100}})
        assert r.status_code == 200, r.text
        doods = r.json()["detections"]
        assert [d["label"] for d in doods] == [d["label"] for d in answer]
        for got, want in zip(doods, answer):
            assert [got["left"], got["top"], got["right"], got["bottom"]] == \
                pytest.approx(corners(want["box_normalized"]), abs=1e-6)
            assert got["confidence"] == pytest.approx(want["score"] * 100, abs=1e-4)
    r = client.post(f"/v2/models/{NAME}/infer", json={
        "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"content_type": "base64"},
                    "data": [base64.b64encode(data).decode()]}], "parameters": {"backend": backend}})
    assert r.status_code == 200, r.text
    out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
    expected = reference.predict(data, backend)["objects"]
    count = int(out["count"][0])
    assert count == len(expected)
    for row, o in zip(out["boxes"][:count], expected):                   # ymin, xmin, ymax, xmax of the input
        x1, y1, x2, y2 = o["input_box"]
        assert row.tolist() == pytest.approx([y1, x1, y2, x2], abs=1e-5)
    assert out["scores"][:count].tolist() == pytest.approx([o["score"] for o in expected], abs=1e-6)


def test_a_jpeg_over_the_decoded_pixels_limit_finds_the_same_objects(served):
    """640 x 400, more than MAX_DECODED_PIXELS: the service decodes it at 1/2 in the DCT, the reference whole; not the
    same pixels, so the issue's measure: each object with its label, IoU >= 0.8, the score within 0.1, and nothing
    confident beside."""
    _, client, reference = served
    photo = np.kron(scene(128, 80), np.ones((5, 5, 1), np.uint8))
    assert photo.shape[0] * photo.shape[1] > MAX_DECODED_PIXELS
    data = encoded(photo, "JPEG", quality=92)
    for backend in BACKENDS:
        expected = reference.predict(data, backend)["objects"]
        found = native(client, data, backend)["detections"]
        assert {"red", "green"} <= {o["label"] for o in expected}
        for o in expected:
            match = max((d for d in found if d["label"] == o["label"]), key=lambda d: iou(corners(d["box"]), o["box"]))
            assert iou(corners(match["box"]), o["box"]) >= 0.8 and abs(match["score"] - o["score"]) <= 0.1
        confident = [d for d in found if d["score"] >= 0.5]
        assert all(any(iou(corners(d["box"]), o["box"]) >= 0.5 and o["label"] == d["label"] for o in expected)
                   for d in confident)
