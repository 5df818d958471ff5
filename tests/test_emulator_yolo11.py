"""A YOLO11-like export served on every backend: tests/yolo_models.py's Ultralytics-layout head (it places the squares
of its scene) with YOLO11's C2PSA attention inside (tests/emulator_yolo11.py), in both forms TFLite's converter
writes it: BATCH_MATMUL of computed operands, and per head a FULLY_CONNECTED whose filter is the softmax.

Imported by `converter import` and asked over a real socket on `cpu` and `emulated`:
- the same objects on both, where the squares are, boxes within the tolerance the other families' tests use;
- `emulated` byte for byte with TFLite's reference kernels up to the decode: OIP v2's rows from the emulator equal
  the decode of BUILTIN_REF's tensors for the same input tensor.
"""

from __future__ import annotations


import httpx
import numpy as np
import pytest

from app.importing.detectors import DetectorOptions
from app.model_dir.reading import read_model_dir
from app.tasks import yolo
from app.tflite_file import read_tflite
from converter.importer import ImportOptions, import_model
from tests import emulator_yolo11, yolo_models
from tests.conftest import Service
from tests.test_detection_families_serving import png
from tests.reference_worker import ReferenceWorker

pytestmark = pytest.mark.slow

LABELS = "red\ngreen\nblue\n"
BACKENDS = ("cpu", "emulated")
SCENE = yolo_models.SCENE
# As tests/test_detection_families_serving.py holds Ultralytics' in-graph decode: within 1.5 input pixels of the
# squares, and the two backends within a pixel of each other.
NEAR_PX, BETWEEN_BACKENDS_PX = 1.5, 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("yolo11")
    models = root / "models"
    labels = root / "labels.txt"
    labels.write_text(LABELS)
    for form in emulator_yolo11.FORMS:
        source = root / f"yolo11_{form}.tflite"
        source.write_bytes(emulator_yolo11.yolo11_like(form))
        import_model([source], ImportOptions(name=f"yolo11_{form}", out=models, labels=labels,
                                             detector=DetectorOptions(min_score=0.5)))
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": ",".join(BACKENDS),
           "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": "yolo11_batched", "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, (ready.text, service.output()[-3000:])
        yield models, client


def boxes_by_label(answer: dict) -> dict[str, list[float]]:
    """label -> box (y_min, x_min, y_max, x_max): the attention moves scores a little, so equal ones may swap."""
    return {d["label"]: [d["box"][k] for k in ("y_min", "x_min", "y_max", "x_max")] for d in answer["detections"]}


@pytest.mark.parametrize("form", emulator_yolo11.FORMS)
def test_yolo11_serves_on_every_backend_and_finds_the_squares(served, form):
    models, client = served
    name = f"yolo11_{form}"
    ready = client.get("/readyz").json()["models"][name]
    assert ready["state"] == "ready", ready  # not degraded: emulated runs it too
    data = png(yolo_models.squares())
    answers = {}
    for backend in BACKENDS:
        r = client.post(f"/v1/models/{name}/detect", params={"backend": backend, "min_score": 0.5},
                        files={"image": data})
        assert r.status_code == 200, r.text
        answers[backend] = r.json()
        assert answers[backend]["backend"] == backend
        found = boxes_by_label(answers[backend])
        assert len(answers[backend]["detections"]) == len(found) == len(SCENE), answers[backend]
        for square in SCENE:
            np.testing.assert_allclose(found[LABELS.split()[square.colour]], np.array(square.box) * yolo_models.SIZE,
                                       atol=NEAR_PX)
    cpu, emulated = boxes_by_label(answers["cpu"]), boxes_by_label(answers["emulated"])
    for label, box in cpu.items():
        np.testing.assert_allclose(box, emulated[label], atol=BETWEEN_BACKENDS_PX)
    listed = client.get(f"/v1/models/{name}")
    assert listed.status_code == 200 and listed.json()["state"] == "ready", listed.text


@pytest.mark.parametrize("form", emulator_yolo11.FORMS)
def test_emulated_rows_are_the_decode_of_the_reference_kernels_tensors(served, form):
    models, client = served
    name = f"yolo11_{form}"
    model = read_model_dir(models / name)
    data = model.file("int8").read_bytes()
    tensor = (yolo_models.squares().astype(np.int16) - 128).astype(np.int8)[None]  # scale 1/255: pixel - 128
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        reference = worker.run(data, [tensor])
    finally:
        worker.close()
    graph = read_tflite(data).graph
    names = [graph.tensors[i].name for i in graph.outputs]
    quantization = {graph.tensors[i].name: graph.tensors[i].quantization for i in graph.outputs}
    raw = {role: yolo.Raw(reference[names.index(tensor_name)], float(quantization[tensor_name].scale[0]),
                          int(quantization[tensor_name].zero_point[0]))
           for role, tensor_name in model.manifest.outputs.items()}
    rows = yolo.decode(model.manifest.detection, raw, yolo_models.SIZE, yolo_models.SIZE)
    r = client.post(f"/v2/models/{name}/infer", json={
        "inputs": [{"name": "image", "shape": list(tensor.shape), "datatype": "INT8", "data": tensor.ravel().tolist()}],
        "parameters": {"backend": "emulated"}})
    assert r.status_code == 200, r.text
    out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
    count = int(out["count"][0])
    assert count == len(rows) == len(SCENE)
    assert out["boxes"][:count].tobytes() == rows.boxes.tobytes()
    assert out["scores"][:count].tobytes() == rows.scores.tobytes()
    assert out["classes"][:count].tolist() == rows.classes.tolist()
