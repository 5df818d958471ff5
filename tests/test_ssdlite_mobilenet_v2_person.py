"""The committed person detector: intact, Edge TPU clean up to its post-processing, finds the people on real photos
in TFLite's interpreter, and is rebuilt by its one command (byte for byte on the kind of CPU that built it)."""

import json
import subprocess
import sys
from pathlib import Path

import flatbuffers.flexbuffers as flexbuffers
import pytest

from app.detection_postprocess import POSTPROCESS_OP as POSTPROCESS
from app.edgetpu.compat import analyze_file
from app.imaging.decoding import decode
from app.imaging.geometry import to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from app.tflite_file import read_tflite
from converter import detection
from converter import ssdlite_person as recipe
from converter.photos import people_photos
from converter.writing import cpu_kind, same_cpu_kind
from tests.conftest import MODELS, ROOT
from tests.detection_models import square_image, tiny_detector

MODEL = MODELS / recipe.NAME
COMMITTED_SHA256 = "35d3df033e60c8ec9872997d7b237f4c981edd8df2e1f38bf427fe6c8ede0808"
OPERATORS = {"ADD": 10, "CONCATENATION": 2, "CONV_2D": 55, "DEPTHWISE_CONV_2D": 33, "DEQUANTIZE": 2, "LOGISTIC": 1,
             "QUANTIZE": 1, "RESHAPE": 13, POSTPROCESS: 1}
CPU_TAIL = ["DEQUANTIZE", "DEQUANTIZE", POSTPROCESS]
# The people on the photos, in pixels (left, top, right, bottom): the float graph's boxes over score 0.5 (0.91-0.996;
# its next best box on each photo scores 0.12 or less), checked by eye.
PEOPLE = {
    "astronaut.png": [(3, 34, 377, 509)],
    "camera.png": [(0, 68, 300, 512)],
    "grace_hopper.jpg": [(1, 13, 509, 600)],
    "messi5.jpg": [(74, 64, 455, 330)],
    "basketball1.png": [(29, 82, 160, 478), (438, 19, 638, 475)],
}
MIN_PIXEL_IOU = 0.85
REBUILD_TIMEOUT_S = 600
# Across kinds of CPU (calibration runs float kernels, whose sums may round differently): the rebuilt int8 model
# still finds every person the float graph finds, its boxes overlap at least this much, its scores stay this close.
MIN_REBUILT_IOU = 0.9
MAX_REBUILT_SCORE_ERROR = 0.1


@pytest.fixture(scope="module")
def model_dir():
    return read_model_dir(MODEL)


def test_the_committed_model_is_intact_and_says_where_it_came_from(model_dir):
    manifest = model_dir.manifest
    path = model_dir.file("int8")  # sha256 checked against model.json
    assert manifest.files["int8"].sha256 == COMMITTED_SHA256
    assert manifest.task == "detection" and model_dir.labels == ("person",)
    assert manifest.input.model_dump(exclude_none=True) == {  # no convention: Coral's
        "width": 300, "height": 300, "channels": 3, "resize": "stretch", "crop_fraction": 0.875, "mean": [127.5] * 3,
        "std": [127.5] * 3}
    assert manifest.quantization.operators == OPERATORS and manifest.quantization.output is None
    assert manifest.quantization.input.dtype == "uint8" and manifest.quantization.input.shape == [1, 300, 300, 3]
    assert manifest.licence == "MIT"
    assert recipe.WHEEL_SHA256 in manifest.source and recipe.GRAPH_SHA256 in manifest.source
    assert manifest.build.command == "python -m converter build ssdlite_mobilenet_v2_person"
    build = manifest.build.model_dump()
    assert build["cpu"]["machine"] and build["tools"]["tensorflow-cpu"]
    assert build["graph_settings"] == {
        "height": 300, "width": 300, "pixel_scale": pytest.approx(0.007843138), "pixel_offset": 1.0,
        "num_classes": 1, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0,
        "nms_iou_threshold": pytest.approx(0.6), "nms_score_threshold": pytest.approx(1e-8),
        "max_detections": 100, "detections_per_class": 100, "anchors": 1917}
    assert path.stat().st_size < 4_000_000


def test_the_recorded_quality_is_int8_against_the_float_graph_on_photos_of_people(model_dir):
    quality = model_dir.manifest.quality
    people = quality.detection["people_photos"]
    assert "frozen float graph" in quality.reference
    for photo in PEOPLE:
        assert photo in quality.data
    assert (people.photos, people.float_objects, people.found, people.recall, people.int8_extra) == (5, 6, 6, 1.0, 0)
    assert (people.iou_min, people.iou_median, people.iou_mean) == (0.9644, 0.9841, 0.9798)
    assert people.max_score_error == 0.0104
    assert {name: len(ious) for name, ious in people.per_photo.items()} == {k: len(v) for k, v in PEOPLE.items()}


def test_everything_before_the_post_processing_maps_to_the_edgetpu(model_dir):
    """Only the op's float feed and the op itself run on the CPU, and only at the end (converter inspect's view)."""
    report = analyze_file(model_dir.file("int8"))
    tail = len(CPU_TAIL)
    assert [v.opcode for v in report.ops[-tail:]] == CPU_TAIL
    assert all(report.on_edgetpu(i) for i in range(report.total - tail))
    assert not any(report.on_edgetpu(i) for i in range(report.total - tail, report.total))
    assert model_dir.manifest.edgetpu_analysis == report.summary()


def test_the_post_process_op_carries_the_graphs_own_settings(model_dir):
    graph = read_tflite(model_dir.file("int8")).graph
    op = graph.operators[-1]
    assert op.opcode == POSTPROCESS
    options = flexbuffers.Loads(op.custom_options)
    settings = model_dir.manifest.build.model_dump()["graph_settings"]
    for key in ("y_scale", "x_scale", "h_scale", "w_scale", "nms_iou_threshold", "nms_score_threshold"):
        assert options[key] == pytest.approx(settings[key], rel=1e-6), key
    for key in ("max_detections", "detections_per_class", "num_classes"):
        assert options[key] == settings[key], key
    assert options["max_classes_per_detection"] == 1 and options["use_regular_nms"] is False
    anchors = graph.tensors[op.inputs[2]]
    assert anchors.type == "FLOAT32" and anchors.shape == (1917, 4)
    ycenter, xcenter, height, width = anchors.data.T  # center-size, as the op reads them
    assert 0 < ycenter.min() and ycenter.max() < 1 and 0 < xcenter.min() and xcenter.max() < 1
    assert (height > 0).all() and (width > 0).all()
    assert (ycenter - height / 2).min() < 0 and (xcenter + width / 2).max() > 1  # not clipped to the image
    assert detection.postprocess_outputs(model_dir.file("int8")) == model_dir.manifest.outputs


def pixel_iou(a, b) -> float:
    width = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - width * height
    return width * height / union


def test_tflite_finds_the_people_on_real_photos(model_dir):
    """The int8 model alone in TFLite's interpreter: the outputs by the names model.json gives, boxes in pixels."""
    from ai_edge_litert.interpreter import Interpreter

    spec = model_dir.manifest.input
    interpreter = Interpreter(model_path=str(model_dir.file("int8")))
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    quantize = InputQuantizer(spec, inp["dtype"], *inp["quantization"])
    index = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    out = {role: index[name] for role, name in model_dir.manifest.outputs.items()}
    photos = {p.name: p for p in people_photos()}
    assert set(photos) == set(PEOPLE)
    for name, expected in PEOPLE.items():
        image = decode(photos[name].read_bytes(), spec, 50_000_000)
        width, height = image.size
        interpreter.set_tensor(inp["index"], quantize(to_pixels(image, spec)))
        interpreter.invoke()
        count = int(interpreter.get_tensor(out["count"])[0])
        scores = interpreter.get_tensor(out["scores"])[0, :count]
        classes = interpreter.get_tensor(out["classes"])[0, :count]
        boxes = interpreter.get_tensor(out["boxes"])[0, :count]
        people = [(b[1] * width, b[0] * height, b[3] * width, b[2] * height)
                  for b, s, c in zip(boxes, scores, classes) if s >= 0.5]
        assert all(model_dir.labels[int(c)] == "person" for c in classes), name
        assert len(people) == len(expected), (name, people)
        for box in expected:
            assert max(pixel_iou(box, found) for found in people) >= MIN_PIXEL_IOU, (name, box, people)


def test_the_float_feed_of_the_post_process_op_is_moved_to_the_end():
    """TF's converter writes each DEQUANTIZE right after its producer: here the box branch's lands before the class
    branch's convolution. edgetpu_compiler follows the data, not that order, so the Edge TPU's part is the same
    before and after cpu_ops_last (everything but the CPU tail); the move keeps the file tidy and the bytes equal."""
    from ai_edge_litert.interpreter import Interpreter

    tiny = tiny_detector(feed="dequantize", order="tf2")
    opcodes = [op.opcode for op in read_tflite(tiny).graph.operators]
    assert opcodes == ["QUANTIZE", "CONV_2D", "RESHAPE", "CONV_2D", "RESHAPE", "LOGISTIC", "DEQUANTIZE", "DEQUANTIZE",
                       POSTPROCESS]
    original = recipe.permute_operators(tiny, [0, 1, 2, 6, 3, 4, 5, 7, 8])  # as TF's converter orders them
    with pytest.raises(recipe.RecipeError, match="would run before its inputs"):
        recipe.permute_operators(tiny, [0, 1, 6, 2, 3, 4, 5, 7, 8])
    before = analyze_file(original)
    assert before.first_unsupported.opcode == "DEQUANTIZE" and before.mapped == before.total - len(CPU_TAIL)
    moved = recipe.cpu_ops_last(original)
    after = analyze_file(moved)
    assert [v.opcode for v in after.ops[-3:]] == CPU_TAIL and after.mapped == after.total - len(CPU_TAIL)
    assert detection.postprocess_outputs(moved) == detection.postprocess_outputs(original)
    assert moved == tiny
    results = []
    for model in (original, moved):
        interpreter = Interpreter(model_content=model)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], square_image(16, 4, 8, 8)[None])
        interpreter.invoke()
        results.append([interpreter.get_tensor(d["index"]).tobytes() for d in interpreter.get_output_details()])
    assert results[0] == results[1] and len(results[0]) == 4


def build(out: Path) -> dict:
    """`python -m converter build ssdlite_mobilenet_v2_person` in a fresh process (it downloads the wheel)."""
    done = subprocess.run([sys.executable, "-m", "converter", "build", recipe.NAME, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=REBUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / recipe.NAME / "model.json").read_text())


@pytest.mark.slow
def test_the_build_command_reproduces_the_committed_model(tmp_path):
    """About a minute on 2 cores (30 s of it converting and calibrating). On the committed build's kind of CPU: the
    committed bytes and figures. On another kind, where calibration's float sums may round otherwise: two rebuilds
    give the same bytes as each other, the same operators, and the int8 model still finds every person the float
    graph finds, within MIN_REBUILT_IOU and MAX_REBUILT_SCORE_ERROR."""
    committed = json.loads((MODEL / "model.json").read_text())
    rebuilt = build(tmp_path / "first")
    assert (tmp_path / "first" / recipe.NAME / "labels.txt").read_bytes() == (MODEL / "labels.txt").read_bytes()
    assert rebuilt["build"]["cpu"] == cpu_kind()
    assert rebuilt["build"]["graph_settings"] == committed["build"]["graph_settings"]
    assert rebuilt["outputs"] == committed["outputs"] and rebuilt["input"] == committed["input"]
    if same_cpu_kind(rebuilt["build"]["cpu"], committed["build"]["cpu"]):
        assert rebuilt["files"]["int8"]["sha256"] == committed["files"]["int8"]["sha256"] == COMMITTED_SHA256
        assert rebuilt["quality"] == committed["quality"]
    else:
        again = build(tmp_path / "second")
        assert again["files"]["int8"]["sha256"] == rebuilt["files"]["int8"]["sha256"]
        assert again["quality"] == rebuilt["quality"]
    assert rebuilt["quantization"]["operators"] == OPERATORS
    people = rebuilt["quality"]["detection"]["people_photos"]
    assert people["found"] == people["float_objects"] == 6 and people["int8_extra"] == 0
    assert people["iou_min"] >= MIN_REBUILT_IOU and people["max_score_error"] <= MAX_REBUILT_SCORE_ERROR
