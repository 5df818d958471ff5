"""Face models served over a real socket: imported by `python -m converter import` from the models the tests build
(tests/face_models.py, tests/face_import_models.py), then asked through /v1/detect, DeepStack's /v1/vision/*,
/v1/models/NAME/embed and OIP v2 on `cpu` and `emulated`.

- every ULFD form finds the test faces where they are (IoU with the drawn boxes), labelled "face", on both backends;
- emulated byte for byte with TFLite's reference kernels up to the decode (OIP v2's rows from the emulator equal the
  decode of BUILTIN_REF's tensors for the same input tensor);
- a RetinaFace-style detector's landmarks come back in the photo's pixels; Coral's SSD face detector answers "face";
- the embedders' vectors are unit length and tell the test people apart; OIP v2's embedding is the reference
  kernels' output, dequantized and normalized, to the last bit.
"""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from app.model_dir.reading import read_model_dir
from app.tasks.priors import LOGITS, PROBABILITIES, decode_faces, dequantize, ultra_light_priors
from app.tflite_file import read_tflite
from converter.importer import ImportOptions, import_model
from tests.conftest import Service
from tests.detection_models import square_image, tiny_detector
from tests.face_import_models import RETINA_SIZE, face_box, face_landmarks, retinaface_like
from tests.face_models import detector_input, draw_face, embedder_input, face_photo
from tests.face_models import tiny_face_detector, tiny_face_embedder

pytestmark = pytest.mark.slow

BACKENDS = ("cpu", "emulated")
FORMS = {"ulfd": ("priors", "softmax"), "ulfd_logits": ("priors", "logits"), "ulfd_test": ("decoded", "softmax"),
         "ulfd_test_logits": ("decoded", "logits")}
EMBEDDERS = {"mfn": ("uint8", "first"), "mfn_int8": ("int8", None)}
# scenes of 48-pixel faces (person, variant, (left, top, side)), some at the edges (tests/test_face_models.py's)
SCENES = [
    [(0, 1, (40, 60, 48)), (1, 2, (200, 100, 48)), (2, 3, (131, 170, 48))],
    [(3, 4, (0, 0, 48)), (4, 5, (272, 192, 48))],
    [],
]
PEOPLE = range(8)


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    models = root / "models"
    for name, (boxes, scores) in FORMS.items():
        source = root / f"{name}.tflite"
        source.write_bytes(tiny_face_detector(boxes, scores))
        import_model([source], ImportOptions(name=name, out=models))
    retina = root / "retinaface.tflite"
    retina.write_bytes(retinaface_like())
    import_model([retina], ImportOptions(name="retina", out=models))
    coral = root / "ssd_mobilenet_v2_face_quant_postprocess.tflite"
    coral.write_bytes(tiny_detector(num_classes=1))
    import_model([coral], ImportOptions(name="coral_face", out=models))
    for name, (io_type, mask) in EMBEDDERS.items():
        source = root / f"{name}.tflite"
        source.write_bytes(tiny_face_embedder(io_type, mask))
        import_model([source], ImportOptions(name=name, out=models, task="embedding"))
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": ",".join(BACKENDS),
           "EDGETPU_SERVE_DEFAULT_DETECTION_MODEL": "ulfd", "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, (ready.text, service.output()[-3000:])
        yield models, client


def detect(client, name: str, data: bytes, **params) -> dict:
    r = client.post(f"/v1/models/{name}/detect", params=params, files={"image": data})
    assert r.status_code == 200, r.text
    return r.json()


def corners(detection: dict) -> tuple[float, ...]:
    return tuple(detection["box"][k] for k in ("x_min", "y_min", "x_max", "y_max"))


@pytest.mark.parametrize("name", FORMS)
def test_each_ulfd_form_finds_the_faces_where_they_are_on_cpu_and_emulated(served, name):
    _, client = served
    for scene, faces in enumerate(SCENES):
        photo, truth = face_photo(faces, seed=scene)
        answers = {backend: detect(client, name, png(photo), backend=backend) for backend in BACKENDS}
        for backend, answer in answers.items():
            found = answer["detections"]
            assert answer["image"] == {"width": 320, "height": 240} and len(found) == len(truth), (backend, found)
            assert {d["label"] for d in found} <= {"face"} and all(d["score"] >= 0.6 for d in found)
            assert all("landmarks" not in d for d in found)  # ULFD gives none: the field is absent
            for face in truth:
                assert max(iou(face.box, corners(d)) for d in found) >= 0.6, (backend, face.box, found)
        # XNNPACK and the reference kernels may differ by one step of an 8-bit output (FACTS): for the is_test
        # export's corners (scale 1/140) that is 2.3 of the 320 pixels
        np.testing.assert_allclose([corners(d) for d in answers["cpu"]["detections"]],
                                   [corners(d) for d in answers["emulated"]["detections"]], atol=320 / 140 + 0.01)


def test_a_larger_photo_is_stretched_to_the_input_and_its_boxes_mapped_back(served):
    _, client = served
    photo, truth = face_photo(SCENES[0], seed=0)
    big = photo.resize((640, 360), Image.Resampling.BILINEAR)  # 2x wide, 1.5x high: stretched back to 320x240
    found = detect(client, "ulfd", png(big), backend="cpu")["detections"]
    assert len(found) == len(truth)
    for face in truth:
        x0, y0, x1, y1 = face.box
        scaled = (x0 * 2, y0 * 1.5, x1 * 2, y1 * 1.5)
        assert max(iou(scaled, corners(d)) for d in found) >= 0.6


def test_deepstack_answers_face_boxes_labelled_face(served):
    _, client = served
    photo, truth = face_photo(SCENES[0], seed=0)
    for path in ("/v1/vision/detection", "/v1/vision/custom/ulfd_test_logits"):
        r = client.post(path, files={"image": png(photo)}, data={"min_confidence": "0.5"})
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        assert [p["label"] for p in predictions] == ["face"] * 3 and r.json()["success"] is True
        for face in truth:
            assert max(iou(face.box, (p["x_min"], p["y_min"], p["x_max"], p["y_max"])) for p in predictions) >= 0.55


def test_oip_v2_rows_from_the_emulator_are_the_decode_of_the_reference_kernels(served):
    """Byte for byte up to the decode: the emulator's tensors are BUILTIN_REF's, so its decoded rows are the
    decode of BUILTIN_REF's tensors."""
    from tests.reference_worker import ReferenceWorker

    models, client = served
    photo, _ = face_photo(SCENES[0], seed=0)
    tensor = detector_input(photo)  # int8, q = pixel - 128: what the service makes of this 320x240 photo
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        for name in FORMS:
            model = read_model_dir(models / name)
            spec = model.manifest.detection
            data = model.file("int8").read_bytes()
            reference = worker.run(data, [tensor])
            graph = read_tflite(data).graph
            outputs = {graph.tensors[i].name: (reference[k], graph.tensors[i].quantization)
                       for k, i in enumerate(graph.outputs)}

            def real(role):
                values, q = outputs[model.manifest.outputs[role]]
                return dequantize(values, (float(q.scale[0]), int(q.zero_point[0])))

            faces = decode_faces(real("boxes"), real("scores"), ultra_light_priors(), min_score=spec.min_score,
                                 iou_threshold=spec.nms_iou, max_detections=spec.max_detections,
                                 form=spec.box_encoding,
                                 scores_are=LOGITS if spec.score_activation == "softmax" else PROBABILITIES)
            r = client.post(f"/v2/models/{name}/infer", json={
                "inputs": [{"name": "image", "shape": [1, 240, 320, 3], "datatype": "INT8",
                            "data": tensor.ravel().tolist()}], "parameters": {"backend": "emulated"}})
            assert r.status_code == 200, r.text
            out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
            count = int(out["count"][0])
            assert count == len(faces) == 3
            assert out["boxes"][:count].tobytes() == faces.boxes.tobytes()
            assert out["scores"][:count].tobytes() == faces.scores.tobytes()
            assert not out["classes"].any() and not out["boxes"][count:].any()
    finally:
        worker.close()


def test_a_retinaface_style_detector_gives_its_landmarks_in_the_photos_pixels(served):
    _, client = served
    width, height = 192, 128  # stretched to 64x64: x / 3, y / 2
    image = Image.fromarray(np.full((height, width, 3), 90, np.uint8))
    expected_box = np.multiply(face_box(), (width, height, width, height))
    expected_points = face_landmarks() * (width, height)
    for backend in BACKENDS:
        (face,) = detect(client, "retina", png(image), backend=backend)["detections"]
        assert face["label"] == "face" and face["score"] > 0.999
        np.testing.assert_allclose(corners(face), expected_box, atol=0.05)
        np.testing.assert_allclose([(p["x"], p["y"]) for p in face["landmarks"]], expected_points, atol=0.05)
    r = client.post("/v1/vision/custom/retina", files={"image": png(image)})
    assert r.status_code == 200 and set(r.json()["predictions"][0]) == {"label", "confidence", "x_min", "y_min",
                                                                        "x_max", "y_max"}
    meta = client.get("/v2/models/retina").json()
    assert {o["name"]: o["shape"] for o in meta["outputs"]}["landmarks"] == [-1, 100, 5, 2]
    tensor = np.zeros((1, RETINA_SIZE, RETINA_SIZE, 3), np.int8)
    r = client.post("/v2/models/retina/infer", json={"inputs": [{
        "name": "image", "shape": list(tensor.shape), "datatype": "INT8", "data": tensor.ravel().tolist()}]})
    out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"][1:]) for o in r.json()["outputs"]}
    assert int(out["count"][0]) == 1
    np.testing.assert_allclose(out["landmarks"][0], face_landmarks(), atol=1e-4)
    assert not out["landmarks"][1:].any()


def test_corals_ssd_face_detector_answers_face(served):
    _, client = served
    square = square_image(16, 4, 4, 8)
    found = detect(client, "coral_face", png(Image.fromarray(square)), min_score=0.5)["detections"]
    assert found and {d["label"] for d in found} == {"face"}


@pytest.mark.parametrize("name", EMBEDDERS)
def test_the_embeddings_are_unit_vectors_that_tell_the_people_apart(served, name):
    _, client = served
    vectors = {backend: {} for backend in BACKENDS}
    for k in PEOPLE:
        for variant in (1, 2, 3):
            data = png(draw_face(k, variant).image)
            for backend in BACKENDS:
                r = client.post(f"/v1/models/{name}/embed", params={"backend": backend}, files={"image": data})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["model"] == name and body["backend"] == backend and body["dimension"] == 128
                vector = np.asarray(body["embedding"], np.float32)
                assert vector.shape == (128,) and abs(float(np.linalg.norm(vector.astype(np.float64))) - 1) < 1e-6
                assert body["norm"] > 0 and {"inference", "total"} <= set(body["timing_ms"])
                vectors[backend].setdefault(k, []).append(vector)
    for by_person in vectors.values():
        same = [float(a @ b) for v in by_person.values() for i, a in enumerate(v) for b in v[i + 1:]]
        different = [float(a @ b) for k, v in by_person.items() for j, w in by_person.items() if j > k
                     for a in v for b in w]
        assert min(same) > max(different), (min(same), max(different))


def test_oip_v2_embedding_is_the_reference_kernels_output_normalized(served):
    from tests.reference_worker import ReferenceWorker

    models, client = served
    model = read_model_dir(models / "mfn")
    tensor = embedder_input(draw_face(5, 2).image)
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        data = model.file("int8").read_bytes()
        reference = worker.run(data, [tensor])
    finally:
        worker.close()
    graph = read_tflite(data).graph
    index = [graph.tensors[i].name for i in graph.outputs].index(model.manifest.outputs["embedding"])
    q = graph.tensors[graph.outputs[index]].quantization
    real = dequantize(reference[index], (float(q.scale[0]), int(q.zero_point[0])))
    expected = (real / np.sqrt(np.dot(real.ravel(), real.ravel()))).astype(np.float32).ravel()
    r = client.post("/v2/models/mfn/infer", json={
        "inputs": [{"name": "image", "shape": list(tensor.shape), "datatype": "UINT8",
                    "data": tensor.ravel().tolist()}], "parameters": {"backend": "emulated"}})
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert np.asarray(out["embedding"]["data"], np.float32).tobytes() == expected.tobytes()
    assert out["raw"]["data"] == reference[index].ravel().tolist()


def test_a_detector_is_not_an_embedder_and_back(served):
    _, client = served
    image = png(draw_face(1).image)
    r = client.post("/v1/models/ulfd/embed", files={"image": image})
    assert r.status_code == 400 and "has task 'detection'" in r.json()["error"]
    r = client.post("/v1/models/mfn/detect", files={"image": image})
    assert r.status_code == 400 and "has task 'embedding'" in r.json()["error"]
    r = client.post("/v1/embed", files={"image": image})  # two embedders, no default: a request names one
    assert r.status_code == 404


def test_the_face_decode_bench_runs_end_to_end():
    """bench/face_decode.py, briefly, in its own process (it pins BLAS to one thread): a row per model, every figure
    parseable and positive, p50 <= p90; the detectors find faces in its photos."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "face_decode.py"), "-n", "20"], capture_output=True,
                          text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("ulfd", "retinaface", "mobilefacenet"))]
    assert len(rows) == 6, done.stdout
    for row in rows:
        found, p50, p90, invoke = (float(v) for v in row.split()[-4:])
        assert found > 0 and 0 < p50 <= p90 and invoke > 0, row
