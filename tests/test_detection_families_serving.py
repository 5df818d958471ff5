"""Every detector family served over a real socket: imported by `python -m converter import` from the exports of
tests/yolo_models.py (heads that place known boxes: the squares of its scene), then asked through /v1/detect,
DeepStack's routes and OIP v2 on `cpu` and `emulated`.

- the same objects on both backends, boxes within a pixel, where the squares are;
- emulated byte for byte with TFLite's reference kernels up to the decode: OIP v2's rows from the emulator equal
  the decode of BUILTIN_REF's tensors for the same input tensor;
- thresholds from model.json, and the request's overrides (min_score, max_detections, DeepStack's min_confidence);
- a TF2 object-detection export with PACK on every backend;
- Frigate's ZMQ door answering `yolo-generic` with a YOLO head's rows (the uint8-input Frigate-like export).
"""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from app.model_dir.reading import read_model_dir
from app.tasks import yolo
from app.importing.detectors import DetectorOptions
from converter.importer import ImportOptions, import_model
from tests import yolo_models
from bench.frigate_client import FrigateClient
from bench.service import free_port
from tests.conftest import Service
from tests.doubles.libedgetpu import libedgetpu_double  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

LABELS = "red\ngreen\nblue\n"
# name -> (builder, its arguments, the import's detector flags)
FAMILIES = {
    "coral_dfl": ("frigate_like", {}, {}),
    "ultralytics": ("ultralytics_like", {}, {"min_score": 0.5}),
    "ultralytics_t": ("ultralytics_like", {"transposed": True, "box_scale": "pixels"}, {}),
}
FRIGATE_U8 = "coral_dfl_u8"  # what Frigate's yolo-generic sends to: a uint8 input (input_dtype int)
SSD = "ssd_tf2"
BACKENDS = ("cpu", "emulated")
# the squares' boxes in input pixels, best first (equal scores: candidate order, the finer grids first)
SCENE = sorted(yolo_models.SCENE, key=lambda s: s.side)
# how far from the squares (input pixels): Ultralytics' in-graph decode holds its weights at int8 (see
# tests/test_detector_families.py EXPORT_TOLERANCE_PX)
NEAR_PX = {"coral_dfl": 0.5, "ultralytics": 1.5, "ultralytics_t": 1.5, SSD: 0.5}


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The families imported into one models directory and served on cpu and emulated."""
    root = tmp_path_factory.mktemp("families")
    models = root / "models"
    labels = root / "labels.txt"
    labels.write_text(LABELS)
    for name, (builder, arguments, flags) in FAMILIES.items():
        source = root / f"{name}.tflite"
        source.write_bytes(getattr(yolo_models, builder)(**arguments))
        import_model([source], ImportOptions(name=name, out=models, labels=labels, detector=DetectorOptions(**flags)))
    frigate = root / f"{FRIGATE_U8}.tflite"
    frigate.write_bytes(yolo_models.frigate_like("uint8"))
    import_model([frigate], ImportOptions(name=FRIGATE_U8, out=models, labels=labels))
    ssd = root / f"{SSD}.tflite"
    ssd.write_bytes(yolo_models.tf2_ssd())
    (root / "labelmap.txt").write_text("???\nred\ngreen")  # TF's labelmap: background first, no final newline
    import_model([ssd], ImportOptions(name=SSD, out=models, labels=root / "labelmap.txt"))
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": ",".join(BACKENDS),
           "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": "coral_dfl",
           "EDGETPU_SERVE_ZMQ_ENDPOINT": f"tcp://127.0.0.1:{free_port()}",
           "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, (ready.text, service.output()[-3000:])
        client.zmq_endpoint = env["EDGETPU_SERVE_ZMQ_ENDPOINT"]
        yield models, client


def detect(client, name: str, data: bytes, **params) -> dict:
    r = client.post(f"/v1/models/{name}/detect", params=params, files={"image": data})
    assert r.status_code == 200, r.text
    return r.json()


def boxes(answer: dict) -> np.ndarray:
    return np.array([[d["box"][k] for k in ("y_min", "x_min", "y_max", "x_max")] for d in answer["detections"]])


@pytest.mark.parametrize("name", [*FAMILIES, SSD])
def test_each_family_finds_the_squares_on_cpu_and_emulated_alike(served, name):
    _, client = served
    scene = yolo_models.SSD_SCENE if name == SSD else SCENE
    size = yolo_models.SSD_SIZE if name == SSD else yolo_models.SIZE
    data = png(yolo_models.squares(scene, size))
    answers = {backend: detect(client, name, data, backend=backend, min_score=0.5) for backend in BACKENDS}
    expected = [s for s in scene] if name != SSD else [scene[1], scene[0]]
    for backend, answer in answers.items():
        assert answer["backend"] == backend and answer["image"] == {"width": size, "height": size}
        assert [d["label"] for d in answer["detections"]] == [LABELS.split()[s.colour] for s in expected], answer
        np.testing.assert_allclose(boxes(answer), [np.array(s.box) * size for s in expected], atol=NEAR_PX[name])
    np.testing.assert_allclose(boxes(answers["cpu"]), boxes(answers["emulated"]), atol=1.0)
    for backend in BACKENDS:  # DeepStack's answer: the same objects, whole pixels
        r = client.post(f"/v1/vision/custom/{name}", params={"backend": backend}, files={"image": data},
                        data={"min_confidence": "0.5"})
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        assert [p["label"] for p in predictions] == [d["label"] for d in answers[backend]["detections"]]
        for p, d in zip(predictions, answers[backend]["detections"]):
            assert p["x_min"] == int(d["box"]["x_min"] + 0.5) and p["y_max"] == int(d["box"]["y_max"] + 0.5)


def test_a_larger_photo_is_letterboxed_and_its_boxes_mapped_back(served):
    """A 256x128 photo: the scene's top half at 4x. Letterboxed, it fills the input's top half (the rest is the
    black padding), and the boxes come back in the photo's pixels: 4x the squares'."""
    _, client = served
    photo = np.kron(yolo_models.squares()[:32], np.ones((4, 4, 1), np.uint8))
    assert photo.shape == (128, 256, 3)
    answer = detect(client, "coral_dfl", png(photo), backend="cpu", min_score=0.5)
    assert answer["image"] == {"width": 256, "height": 128}
    found = {d["label"]: [d["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")] for d in answer["detections"]}
    assert set(found) == {"red", "green"}  # the blue square was in the bottom half
    for square in SCENE[:2]:
        assert found[LABELS.split()[square.colour]] == pytest.approx(
            [square.left * 4, square.top * 4, (square.left + square.side) * 4, (square.top + square.side) * 4], abs=2)


def test_thresholds_from_model_json_and_the_requests_overrides(served):
    models, client = served
    data = png(yolo_models.squares())
    assert read_model_dir(models / "ultralytics").manifest.detection.min_score == 0.5   # --min-score 0.5
    assert read_model_dir(models / "coral_dfl").manifest.detection.min_score == 0.25    # the default
    assert len(detect(client, "ultralytics", data)["detections"]) == 3                  # the model's 0.5
    assert detect(client, "ultralytics", data, min_score=0.99)["detections"] == []      # the request's
    assert len(detect(client, "ultralytics", data, max_detections=1)["detections"]) == 1
    weak = detect(client, "coral_dfl", data, min_score=0.1)["detections"]               # corners of lit blocks
    assert len(weak) > 3 and min(d["score"] for d in weak) < 0.25
    assert [d["label"] for d in detect(client, "coral_dfl", data, labels="green")["detections"]] == ["green"]
    r = client.post("/v1/vision/detection", files={"image": data}, data={"min_confidence": "0.99"})
    assert r.status_code == 200 and r.json()["predictions"] == []                       # the default detector
    assert len(client.post("/v1/vision/detection", files={"image": data}).json()["predictions"]) == 3


def test_oip_v2_gives_the_decoded_rows_and_the_emulator_matches_the_reference_kernels(served):
    """v2's outputs of a YOLO model are its decoded rows (boxes, classes, scores, count, like the post-process op's);
    from the emulator they equal the decode of TFLite's reference kernels' tensors for the same input tensor."""
    from tests.reference_worker import ReferenceWorker

    models, client = served
    pixels = yolo_models.squares()
    for name in FAMILIES:
        model = read_model_dir(models / name)
        meta = client.get(f"/v2/models/{name}").json()
        spec = model.manifest.detection
        k = spec.max_detections
        assert {o["name"]: o["shape"] for o in meta["outputs"]} == {"boxes": [-1, k, 4], "classes": [-1, k],
                                                                    "scores": [-1, k], "count": [-1, 1]}
        data = model.file("int8").read_bytes()
        tensor = (pixels.astype(np.int16) - 128).astype(np.int8)[None]  # int8 input, scale 1/255: pixel - 128
        worker = ReferenceWorker("BUILTIN_REF")
        try:
            reference = worker.run(data, [tensor])
        finally:
            worker.close()
        from app.tflite_file import read_tflite

        graph = read_tflite(data).graph
        names = [graph.tensors[i].name for i in graph.outputs]
        quantization = {graph.tensors[i].name: graph.tensors[i].quantization for i in graph.outputs}
        raw = {role: yolo.Raw(reference[names.index(tensor_name)], float(quantization[tensor_name].scale[0]),
                              int(quantization[tensor_name].zero_point[0]))
               for role, tensor_name in model.manifest.outputs.items()}
        rows = yolo.decode(spec, raw, 64, 64)
        r = client.post(f"/v2/models/{name}/infer", json={
            "inputs": [{"name": "image", "shape": [1, 64, 64, 3], "datatype": "INT8", "data": tensor.ravel().tolist()}],
            "parameters": {"backend": "emulated"}})
        assert r.status_code == 200, r.text
        out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
        count = int(out["count"][0])
        assert count == len(rows) == 3
        assert out["boxes"][:count].tobytes() == rows.boxes.tobytes()
        assert out["scores"][:count].tobytes() == rows.scores.tobytes()
        assert out["classes"][:count].tolist() == rows.classes.tolist() and not out["boxes"][count:].any()
        b64 = base64.b64encode(png(pixels)).decode()  # BYTES images: the same rows, letterboxed at 64x64 as is
        r = client.post(f"/v2/models/{name}/infer", json={
            "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"content_type": "base64"},
                        "data": [b64]}], "parameters": {"backend": "emulated"}})
        assert r.status_code == 200 and int(r.json()["outputs"][3]["data"][0]) == 3


def test_a_yolo_model_and_its_compiled_twin_serve_on_edgetpu_through_the_libedgetpu_double(tmp_path,
                                                                                             libedgetpu_double):
    """The plain file and its _edgetpu.tflite (the compiler's TEST DOUBLE output: one edgetpu-custom-op between the
    model's own tensors) imported together; on `edgetpu` the libedgetpu TEST DOUBLE fills the op's outputs with a
    stand-in, so the wiring is real and the numbers are not: the decode runs on them on the CPU all the same."""
    from tests.doubles.compiled_model_double import compiled_model_bytes
    from tests.doubles.libedgetpu import DEVICES

    plain = tmp_path / "coral.tflite"
    plain.write_bytes(yolo_models.frigate_like())
    compiled = tmp_path / "coral_edgetpu.tflite"
    compiled.write_bytes(compiled_model_bytes(source=plain.read_bytes()))
    labels = tmp_path / "labels.txt"
    labels.write_text(LABELS)
    models = tmp_path / "models"
    import_model([plain, compiled], ImportOptions(name="coral", out=models, labels=labels))
    node = tmp_path / "apex_0"
    node.write_bytes(b"")
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu",
           "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": "coral", "EDGETPU_SERVE_WORKERS": "1",
           "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
           DEVICES: f"pci:{node}"}
    data = png(yolo_models.squares())
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        assert client.get("/readyz").status_code == 200, service.output()[-2000:]
        on_tpu = client.post("/v1/detect", files={"image": data})
        assert on_tpu.status_code == 200 and on_tpu.json()["backend"] == "edgetpu", on_tpu.text
        deepstack = client.post("/v1/vision/detection", files={"image": data})
        assert deepstack.status_code == 200 and deepstack.json()["success"] is True
        on_cpu = detect(client, "coral", data, backend="cpu", min_score=0.5)
        assert [d["label"] for d in on_cpu["detections"]] == ["red", "green", "blue"]
        v2 = client.post("/v2/models/coral/infer", json={
            "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"content_type": "base64"},
                        "data": [base64.b64encode(data).decode()]}], "parameters": {"backend": "edgetpu"}})
        assert v2.status_code == 200 and [o["name"] for o in v2.json()["outputs"]] == ["boxes", "classes", "scores",
                                                                                        "count"]


def test_frigates_yolo_generic_over_zmq_gives_the_heads_rows_by_frigates_rule(served):
    """Frigate's zmq detector with model_type yolo-generic (sent as its enum's name, "yologeneric") and the tensor of
    the scene: the [20, 6] rows are the model's decoded rows (OIP v2's, from the same tensor on the same backend)
    by Frigate's rule (best first, stopping at the first below 0.4, at most 20), and they place the squares."""
    _, client = served
    tensor = yolo_models.squares()[None]  # uint8 [1, 64, 64, 3], the pixels as Frigate sends them
    frigate = FrigateClient(client.zmq_endpoint, f"{FRIGATE_U8}.tflite", model_type="yologeneric", timeout_ms=60_000)
    try:
        assert frigate.start(), frigate.answers
        rows = frigate.detect(tensor)
    finally:
        frigate.socket.close(linger=0)
    r = client.post(f"/v2/models/{FRIGATE_U8}/infer", json={
        "inputs": [{"name": "image", "shape": list(tensor.shape), "datatype": "UINT8", "data": tensor.ravel().tolist()}],
        "parameters": {"backend": "cpu"}})
    assert r.status_code == 200, r.text
    out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
    kept = [i for i in range(int(out["count"][0]))][:20]
    first_low = next((n for n, i in enumerate(kept) if out["scores"][i] < 0.4), len(kept))
    expected = np.zeros((20, 6), np.float32)
    for n, i in enumerate(kept[:first_low]):
        expected[n] = (out["classes"][i], out["scores"][i], *out["boxes"][i])
    assert (rows[:, 0] == expected[:, 0]).all(), (rows, expected)
    np.testing.assert_allclose(rows[:, 1:], expected[:, 1:], atol=0.02)
    found = rows[rows[:, 1] > 0]
    assert sorted(found[:, 0].astype(int).tolist()) == sorted(s.colour for s in SCENE)
    for square in SCENE:
        row = found[found[:, 0] == square.colour][0]
        np.testing.assert_allclose(row[2:], square.box, atol=0.5 / yolo_models.SIZE)
