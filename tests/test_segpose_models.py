"""The test-built segmenter and pose model (tests/segmentation_models.py, tests/pose_models.py), quantized by the
project's converter and imported as a Coral owner imports Coral's files, mean what they are built to mean through
the service's own preprocessing and the tasks' decoding; the emulator gives TFLite's reference kernels' bytes on
them (BUILTIN_REF, in a subprocess), MoveNet's float tail included; and the service, over a real socket, answers
/v1/segment (JSON and PNG), /v1/pose and OIP v2 with exactly TFLite's outputs mapped the same way: on `cpu` the
interpreter's (XNNPACK, as the cpu backend runs it), on `emulated` the reference kernels'.
"""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from app.tasks import pose, segment
from app.tflite_file import read_tflite
from converter.importer import ImportOptions, import_model
from tests import pose_models, segmentation_models
from tests.conftest import Service
from tests.reference_worker import ReferenceWorker

pytestmark = pytest.mark.slow

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Both models built, written as files and imported: (segmenter ModelDir, pose ModelDir)."""
    work = tmp_path_factory.mktemp("segpose")
    segmenter = work / "shapes_segmenter.tflite"
    segmenter.write_bytes(segmentation_models.build_segmenter())
    labels = work / "labels.txt"
    labels.write_text("\n".join(segmentation_models.LABELS) + "\n")
    seg = import_model([segmenter], ImportOptions(name="shapes", out=work / "models", labels=labels,
                                                  mean=[segmentation_models.MEAN], std=[segmentation_models.STD]))
    # the same file center-cropped: pixels outside the crop are not seen
    import_model([segmenter], ImportOptions(name="shapes_crop", out=work / "models", labels=labels, resize="center_crop",
                                            mean=[segmentation_models.MEAN], std=[segmentation_models.STD]))
    movenet = work / "disc_pose.tflite"
    movenet.write_bytes(pose_models.build_pose_model())
    pos = import_model([movenet], ImportOptions(name="disc_pose", out=work / "models"))
    return read_model_dir(seg.path), read_model_dir(pos.path)


@pytest.fixture(scope="module")
def served(models):
    """The service on both models (and the center-cropped segmenter), cpu and emulated, over a real socket."""
    root = models[0].path.parent
    env = {"EDGETPU_SERVE_MODEL_DIR": str(root), "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
           "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_DEFAULT_SEGMENTATION_MODEL": "shapes"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=120) as client:
        yield client


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def service_input(model_dir, data: bytes) -> tuple[np.ndarray, Geometry]:
    """The input tensor as the service makes it (decode, resize, quantize with the input's own parameters), and
    the geometry."""
    spec = model_dir.manifest.input
    image, source = decode_with_source(data, spec, MAX_PIXELS)
    detail = read_tflite(model_dir.file("int8")).graph
    tensor = detail.tensors[detail.inputs[0]]
    q = tensor.quantization
    quantizer = InputQuantizer(spec, tensor.dtype, 0.0 if q is None else float(q.scale[0]),
                               0 if q is None else int(q.zero_point[0]))
    return quantizer(to_pixels(image, spec)), Geometry.of(source, image.size, spec)


def tflite(model_dir, tensor: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model_dir.file("int8")), num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], tensor)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_they_import_as_coral_files_do(models):
    seg, pos = models
    graph = read_tflite(seg.file("int8")).graph
    output = graph.tensors[graph.outputs[0]]
    assert (output.type, output.shape) == ("INT64", (1, 32, 32))  # as DeepLab's ArgMax [1, 513, 513]
    assert (seg.manifest.task, seg.manifest.outputs) == ("segmentation", {"class_map": output.name})
    assert seg.labels == segmentation_models.LABELS
    assert "ARG_MAX over the 3 channels" in seg.manifest.imported.task
    ops = {op.opcode for op in graph.operators}
    assert {"CONV_2D", "RESIZE_BILINEAR", "ARG_MAX"} <= ops
    assert "the CPU runs ARG_MAX after it, as intended" in seg.manifest.edgetpu_analysis
    assert pos.manifest.task == "pose" and pos.labels == pose.KEYPOINT_NAMES
    graph = read_tflite(pos.file("int8")).graph
    assert graph.tensors[graph.inputs[0]].quantization is None  # raw uint8, cast inside, as MoveNet's
    ops = {op.opcode for op in graph.operators}
    assert {"CAST", "ARG_MAX", "FLOOR_DIV", "GATHER_ND", "PACK", "UNPACK", "SQRT", "DIV", "DEQUANTIZE"} <= ops
    floats = {op.opcode for op in graph.operators if op.opcode in ("SQRT", "DIV")
              and graph.tensors[op.outputs[0]].type == "FLOAT32"}
    assert floats == {"SQRT", "DIV"}  # float islands, as in Coral's MoveNet files
    assert pos.manifest.input.mean == [0.0] and pos.manifest.input.std == [1.0]


@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_the_segmenter_finds_the_coloured_regions_of_the_original(models, resize):
    seg, _ = models
    seg = seg.__class__(path=seg.path, manifest=seg.manifest.model_copy(
        update={"input": seg.manifest.input.model_copy(update={"resize": resize})}), labels=seg.labels)
    width, height = 400, 260
    boxes = {1: (40, 30, 200, 150), 2: (250, 120, 380, 240)}
    tensor, geometry = service_input(seg, png(segmentation_models.shapes_image(width, height, boxes)))
    cmap = segment.class_map(tflite(seg, tensor))
    where = segment.sampling(geometry, *cmap.shape)
    mask = segment.mask(cmap, where, len(seg.labels))
    truth = np.zeros((height, width), np.uint8)
    for class_id, (left, top, right, bottom) in boxes.items():
        truth[top:bottom, left:right] = class_id
    # a 32x32 model on a 400x260 photo: its edges are 2 input pixels (25 of the photo's) wide, its regions exact
    margin = 2 * width // segmentation_models.SIZE
    for class_id, (left, top, right, bottom) in boxes.items():
        assert np.all(mask[top + margin:bottom - margin, left + margin:right - margin] == class_id)
    assert np.all(mask[:, :40 - margin][:height // 2] == 0)
    assert (mask == truth).mean() > 0.9
    shares = {s.label: s.fraction for s in segment.shares(cmap, where, seg.labels)}
    assert shares == pytest.approx({"background": (truth == 0).mean(), "red": (truth == 1).mean(),
                                    "green": (truth == 2).mean()}, abs=0.05)


def test_the_pose_models_keypoints_follow_the_disc(models):
    _, pos = models
    width, height, radius = 300, 240, 45
    cell = width / pose_models.CELLS  # a heatmap cell, in the photo's pixels
    means = []
    for cx, cy in ((150, 120), (90, 170), (220, 70)):
        tensor, geometry = service_input(pos, png(pose_models.disc_image(width, height, cx, cy, radius)))
        out = tflite(pos, tensor)
        assert out.dtype == np.float32 and out.shape == (1, 1, 17, 3)
        (found,) = pose.poses(pose.keypoint_values(out, 0.0, 0), geometry, pos.labels)
        xs, ys = np.array([k.x for k in found.keypoints]), np.array([k.y for k in found.keypoints])
        assert np.all(np.hypot(xs - cx, ys - cy) < radius + 1.5 * cell)  # on the disc, give or take a cell
        assert 0.5 < found.score <= 1
        means.append((xs.mean() - cx, ys.mean() - cy))
    # the figure moves with the disc: where its keypoints sit around the disc's centre stays put
    assert np.ptp(np.array(means), axis=0).max() < 1.5 * cell


def test_the_emulator_gives_the_reference_kernels_bytes(models):
    from app.emulator import Interpreter as Emulator

    seg, pos = models
    rng = np.random.default_rng(1)
    cases = [(seg, png(segmentation_models.drawing(rng, 96)[0])) for _ in range(3)]
    cases += [(pos, png(pose_models.disc_image(160, 120, *rng.uniform(30, 100, 2), rng.uniform(15, 40))))
              for _ in range(3)]
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        for model_dir, data in cases:
            model = model_dir.file("int8").read_bytes()
            tensor, _ = service_input(model_dir, data)
            emulator = Emulator(model_content=model)
            emulator.allocate_tensors()
            emulator.set_tensor(emulator.get_input_details()[0]["index"], tensor)
            emulator.invoke()
            ours = emulator.get_tensor(emulator.get_output_details()[0]["index"])
            (theirs,) = reference.run(model, [tensor])
            assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), model_dir.name
    finally:
        reference.close()


def expected_outputs(model_dir, data: bytes, backend: str, reference: ReferenceWorker) -> tuple[np.ndarray, Geometry]:
    """TFLite's output for the service's input tensor: the interpreter as `cpu` runs it, or the reference kernels
    for `emulated`; with the geometry."""
    tensor, geometry = service_input(model_dir, data)
    if backend == "cpu":
        return tflite(model_dir, tensor), geometry
    (out,) = reference.run(model_dir.file("int8").read_bytes(), [tensor])
    return out, geometry


def photos() -> list[bytes]:
    """Photos of shapes: another size and aspect than the model's, a JPEG, and a tall one."""
    boxes = {1: (30, 40, 150, 140), 2: (200, 60, 300, 200)}
    wide = segmentation_models.shapes_image(320, 240, boxes)
    out = io.BytesIO()
    Image.fromarray(wide).save(out, "JPEG", quality=95)
    tall = segmentation_models.shapes_image(120, 260, {1: (10, 20, 100, 90), 2: (20, 150, 110, 250)})
    return [png(wide), out.getvalue(), png(tall)]


@pytest.mark.parametrize("backend", ["cpu", "emulated"])
@pytest.mark.parametrize("model", ["shapes", "shapes_crop"])
def test_the_served_mask_is_tflites_class_map_mapped_back(models, served, backend, model):
    seg = read_model_dir(models[0].path.parent / model)
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        for data in photos():
            out, geometry = expected_outputs(seg, data, backend, reference)
            cmap = segment.class_map(out)
            where = segment.sampling(geometry, *cmap.shape)
            r = served.post(f"/v1/models/{model}/segment?format=png&backend={backend}", content=data,
                            headers={"content-type": "application/octet-stream"})
            assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text
            assert r.headers["x-backend"] == backend and "inference" in json.loads(r.headers["x-timing-ms"])
            mask = np.asarray(Image.open(io.BytesIO(r.content)))
            assert np.array_equal(mask, segment.mask(cmap, where, len(seg.labels)))
            answer = served.post(f"/v1/models/{model}/segment?backend={backend}", files={"image": data}).json()
            assert answer["image"] == {"width": geometry.width, "height": geometry.height}
            expected = segment.shares(cmap, where, seg.labels)
            assert [(c["class_id"], c["label"]) for c in answer["classes"]] == [(c.class_id, c.label) for c in expected]
            assert [c["fraction"] for c in answer["classes"]] == pytest.approx([c.fraction for c in expected])
            assert answer["seen"] == pytest.approx(where.seen) and (answer["seen"] < 1) == (model == "shapes_crop")
            assert set(answer["timing_ms"]) >= {"decode", "preprocess", "queue", "inference", "postprocess", "total"}
            assert answer["backend"] == backend and isinstance(answer["cold"], bool) and "load_ms" in answer["warmup"]
    finally:
        reference.close()


@pytest.mark.parametrize("backend", ["cpu", "emulated"])
def test_the_served_keypoints_are_tflites_mapped_back(models, served, backend):
    _, pos = models
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        for cx, cy, width, height in ((150, 120, 300, 240), (60, 200, 160, 260)):
            data = png(pose_models.disc_image(width, height, cx, cy, 40))
            out, geometry = expected_outputs(pos, data, backend, reference)
            (expected,) = pose.poses(pose.keypoint_values(out, 0.0, 0), geometry, pos.labels)
            answer = served.post(f"/v1/models/disc_pose/pose?backend={backend}", files={"image": data}).json()
            assert answer["backend"] == backend and answer["image"] == {"width": width, "height": height}
            (got,) = answer["poses"]
            assert got["score"] == pytest.approx(expected.score)
            assert [k["name"] for k in got["keypoints"]] == list(pose.KEYPOINT_NAMES)
            for keypoint, want in zip(got["keypoints"], expected.keypoints, strict=True):
                assert (keypoint["x"], keypoint["y"], keypoint["score"]) == pytest.approx((want.x, want.y, want.score))
    finally:
        reference.close()


def test_the_default_routes_and_oip_v2_named_outputs(models, served):
    seg, pos = models
    data = photos()[0]
    by_default = served.post("/v1/segment", files={"image": data}).json()
    assert by_default["model"] == "shapes" and by_default["classes"][0]["label"] == "background"
    assert served.post("/v1/pose", files={"image": png(pose_models.disc_image(64, 64, 32, 32, 12))}).json()["model"] \
        == "disc_pose"
    meta = served.get("/v2/models/shapes").json()
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [("class_map", "INT32", [-1, 32, 32])]
    pixels = segmentation_models.shapes_image(32, 32, {1: (2, 2, 14, 14), 2: (18, 18, 30, 30)})
    r = served.post("/v2/models/shapes/infer", json={"inputs": [{
        "name": "image", "shape": [1, 32, 32, 3], "datatype": "UINT8", "data": pixels.reshape(-1).tolist()}]})
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]  # a raw tensor is the model's input as it is (no normalization)
    assert np.array_equal(np.asarray(output["data"]).reshape(32, 32), segment.class_map(tflite(seg, pixels[None])))
    meta = served.get("/v2/models/disc_pose").json()
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [("keypoints", "FP32", [-1, 1, 17, 3])]
    disc = pose_models.disc_image(64, 64, 40, 24, 12)
    r = served.post("/v2/models/disc_pose/infer", json={"inputs": [{
        "name": "image", "shape": [1, 64, 64, 3], "datatype": "UINT8", "data": disc.reshape(-1).tolist()}]})
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    assert np.asarray(output["data"], np.float32).reshape(1, 1, 17, 3).tobytes() == tflite(pos, disc[None]).tobytes()


def test_a_model_of_another_task_or_a_bad_format_is_refused(served):
    data = photos()[0]
    r = served.post("/v1/models/disc_pose/segment", files={"image": data})
    assert r.status_code == 400 and "has task 'pose'" in r.json()["error"]
    r = served.post("/v1/models/shapes/pose", files={"image": data})
    assert r.status_code == 400 and "has task 'segmentation'" in r.json()["error"]
    assert served.post("/v1/models/shapes/segment?format=bmp", files={"image": data}).status_code == 422
    assert served.post("/v1/models/nope/segment", files={"image": data}).status_code == 404
