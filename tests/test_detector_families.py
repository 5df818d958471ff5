"""app/importing/detectors.py through `python -m converter import`: each detector family recognised from the file
itself, its roles and decoding written to model.json, and a flag with the reason where the file cannot tell.

Fast: graph stubs with the outputs' shapes, types and quantization (tests/yolo_models.py yolo_stub). Slow: real
exports of Keras/TF heads that place known boxes, quantized with the project's converter, imported and run on
TFLite's CPU kernels and the emulator, their decoded boxes where the squares are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.model_dir.reading import read_model_dir
from app.tasks import yolo
from converter.__main__ import main
from converter.importer import ImportOptions, ImportRefused, import_model
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.yolo_models import Out, ultralytics_metadata, yolo_stub

COCO = ["person", "bicycle", "car"] + [f"class{i}" for i in range(3, 80)]


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def imported(tmp_path, data: bytes, name: str = "m", **options):
    model = write(tmp_path / f"{name}.tflite", data)
    done = import_model([model], ImportOptions(name=name, out=tmp_path / "models", **options))
    return read_model_dir(done.path).manifest, done


def refused(tmp_path, data: bytes, name: str = "refused", **options) -> str:
    with pytest.raises(ImportRefused) as caught:
        imported(tmp_path, data, name, **options)
    assert not (tmp_path / "models" / name).exists()
    return str(caught.value)


# ---- Ultralytics' one tensor ------------------------------------------------------------------------------------

ULTRALYTICS_320 = Out("Identity", 84, transposed=True, logistic=True)


def test_an_ultralytics_export_at_320_is_one_tensor_attributes_first(tmp_path):
    data = yolo_stub([Out("Identity", 84, transposed=True)], size=320)
    manifest, done = imported(tmp_path, data)
    spec = manifest.detection
    assert manifest.task == "detection" and manifest.outputs == {"predictions": "Identity"}
    assert (spec.decoder, spec.classes, spec.layout, spec.box_format, spec.box_scale, spec.objectness) == \
        ("yolo", 80, "attributes_first", "xywh", "normalized", False)
    assert (spec.nms_iou, spec.min_score, spec.max_detections, spec.class_agnostic) == (0.45, 0.25, 100, False)
    assert manifest.input.resize == "letterbox" and "YOLO heads are trained on letterboxed" in manifest.imported.input
    assert "2100 candidates" in manifest.imported.scores and "up to 1: fractions" in manifest.imported.scores


def test_the_transposed_export_and_yolov5s_objectness(tmp_path):
    spec = imported(tmp_path, yolo_stub([Out("out", 84)], size=320), name="t")[0].detection
    assert (spec.layout, spec.classes, spec.objectness) == ("anchors_first", 80, False)
    v5 = imported(tmp_path, yolo_stub([Out("out", 85, anchors_per_cell=3)], size=320), name="v5")[0].detection
    assert (v5.layout, v5.classes, v5.objectness) == ("anchors_first", 80, True)   # [1, 6300, 85]
    p6 = imported(tmp_path, yolo_stub([Out("out", 84, transposed=True)], size=256, strides=(8, 16, 32, 64)),
                  name="p6")[0]
    assert p6.detection.classes == 80 and "strides [8, 16, 32, 64]" in " ".join(p6.imported.notes)


def test_scores_made_by_a_logistic_are_probabilities_a_range_below_zero_logits(tmp_path):
    probabilities = imported(tmp_path, yolo_stub([ULTRALYTICS_320], size=320), name="p")[0]
    assert probabilities.detection.score_activation == "none"
    assert "made by a LOGISTIC" in probabilities.imported.scores
    logits = imported(tmp_path, yolo_stub([Out("o", 7, transposed=True, scale=0.1, zero_point=0)], size=64),
                      name="l", detector=_options(box_scale="pixels"))[0]
    assert logits.detection.score_activation == "sigmoid" and "logits" in logits.imported.scores


def test_box_scale_from_the_quantization_range_or_the_flag(tmp_path):
    pixels = imported(tmp_path, yolo_stub([Out("o", 84, transposed=True, scale=1.4, zero_point=-128)], size=320),
                      name="px")[0]
    assert pixels.detection.box_scale == "pixels" and "up to 357: pixels" in pixels.imported.scores
    between = yolo_stub([Out("o", 84, transposed=True, scale=0.05, zero_point=-128)], size=320)  # up to 12.75
    message = refused(tmp_path, between)
    assert "--box-scale normalized or --box-scale pixels" in message and "up to 12.8" in message
    assert imported(tmp_path, between, name="m", detector=_options(box_scale="pixels"))[0].detection.box_scale == \
        "pixels"


def test_a_float_output_is_read_through_its_dequantize(tmp_path):
    manifest = imported(tmp_path, yolo_stub([Out("o", 84, transposed=True, dequantized=True)], size=320))[0]
    assert manifest.detection.box_scale == "normalized" and manifest.detection.classes == 80


def test_ultralytics_metadata_names_the_classes_and_its_other_tasks_are_left_alone(tmp_path):
    data = yolo_stub([ULTRALYTICS_320], size=320, metadata=ultralytics_metadata(COCO, imgsz=320))
    manifest, done = imported(tmp_path, data)
    model = read_model_dir(done.path)
    assert model.labels[:3] == ("person", "bicycle", "car") and len(model.labels) == 80
    assert "Ultralytics' metadata (metadata.json" in manifest.imported.labels
    assert "the 80 names in Ultralytics' metadata" in manifest.imported.scores
    pose = yolo_stub([Out("o", 56, transposed=True)], size=320, metadata=ultralytics_metadata(["person"], "pose"))
    assert "not a YOLO" not in refused(tmp_path, pose)  # not claimed as a detector: another importer's


def test_what_the_shape_cannot_tell_is_asked_for(tmp_path):
    odd = yolo_stub([Out("o", 9, transposed=True)], size=64, strides=(16, 32))  # 20 candidates: no stride set fits
    message = refused(tmp_path, odd)
    assert "is not a YOLO head's at its 64x64 input" in message and "--strides" in message
    assert imported(tmp_path, odd, name="s", detector=_options(strides=[16, 32]))[0].detection.classes == 5
    message = refused(tmp_path, yolo_stub([Out("o", 9, transposed=True)]), detector=_options(classes=7))
    assert "not 4 box values and 7 classes" in message and "--classes" in message
    v5 = imported(tmp_path, yolo_stub([Out("o", 9, transposed=True)]), name="x", detector=_options(classes=4))[0]
    assert v5.detection.objectness is True   # 9 = 4 + 1 + 4: told by --classes


def test_an_export_with_nms_inside_is_refused_with_the_export_flag(tmp_path):
    g_rows = yolo_stub([Out("detections", 6)], size=320, strides=(32,) * 3)  # [1, 300, 6]: 3 x 100 cells of 32
    message = refused(tmp_path, g_rows)
    assert "already suppressed inside the model (300 rows" in message and "nms=False" in message


def test_the_thresholds_given_are_written(tmp_path):
    spec = imported(tmp_path, yolo_stub([ULTRALYTICS_320], size=320),
                    detector=_options(min_score=0.4, nms_iou=0.6, max_detections=20, class_agnostic=True))[0].detection
    assert (spec.min_score, spec.nms_iou, spec.max_detections, spec.class_agnostic) == (0.4, 0.6, 20, True)


# ---- the Coral/Frigate pair --------------------------------------------------------------------------------------

LOGITS = Out("logits", 80, scale=0.1, zero_point=0)
BINS = Out("bins", 64, scale=0.1, zero_point=-20)


@pytest.mark.parametrize("order", [(LOGITS, BINS), (BINS, LOGITS), (BINS, Out("max", 1), LOGITS)])
def test_frigates_pair_is_told_apart_by_shape_in_any_order(tmp_path, order):
    manifest, done = imported(tmp_path, yolo_stub(list(order), size=320))
    spec = manifest.detection
    assert manifest.outputs == {"class_logits": "logits", "box_distributions": "bins"}
    assert (spec.decoder, spec.classes, spec.strides, spec.reg_max, spec.score_activation) == \
        ("yolo_dfl", 80, [8, 16, 32], 16, "sigmoid")
    if len(order) == 3:
        assert any("'max' [1, 2100, 1] is not read" in note for note in done.notes)


def test_64_classes_beside_64_bins_need_the_roles_named(tmp_path):
    data = yolo_stub([Out("a", 64, scale=0.1, zero_point=0), Out("b", 64, scale=0.1, zero_point=0)], size=64)
    message = refused(tmp_path, data)
    assert "--output class_logits=TENSOR" in message
    manifest = imported(tmp_path, data, detector=_options(outputs={"class_logits": "b"}))[0]
    assert manifest.outputs == {"class_logits": "b", "box_distributions": "a"}


def test_an_int8_file_compiled_for_the_edge_tpu_alone_is_recognised_by_its_outputs(tmp_path):
    plain = yolo_stub([LOGITS, BINS], size=320)
    manifest, done = imported(tmp_path, compiled_model_bytes(source=plain), name="m_edgetpu")
    assert manifest.detection.decoder == "yolo_dfl" and set(manifest.files) == {"edgetpu"}
    assert manifest.detection.score_activation == "sigmoid"  # the range, the graph being hidden in the custom op


def test_the_uint8_flavour(tmp_path):
    data = yolo_stub([Out("o", 84, transposed=True, type="UINT8", zero_point=0)], size=320, input_type="UINT8")
    manifest = imported(tmp_path, data)[0]
    assert manifest.detection.box_scale == "normalized" and manifest.input.mean == [0]


# ---- SSDs, and the command line -------------------------------------------------------------------------------------

def test_an_ssd_keeps_its_op_and_records_its_class_count(tmp_path):
    from tests.detection_models import tiny_detector

    manifest = imported(tmp_path, tiny_detector(order="tf2", num_classes=5), detector=_options(min_score=0.6))[0]
    assert manifest.detection.model_dump(exclude_none=True) == {"decoder": "postprocess", "classes": 5,
                                                                "min_score": 0.6}
    assert manifest.input.resize == "stretch"


@pytest.mark.parametrize(("text", "expected"), [
    ("???\r\nperson\r\n???\r\ncar", "person\n\ncar\n"),       # TF's labelmap, CRLF, no final newline
    ("0  person\r\n2  car", "person\n\ncar\n"),                 # Coral's `id label` with a gap, CRLF
])
def test_an_ssds_labels_in_the_forms_users_have_them(tmp_path, text, expected):
    from tests.detection_models import tiny_detector

    manifest, done = imported(tmp_path, tiny_detector(order="tf2", num_classes=3),
                              labels=write(tmp_path / "labels.txt", text))
    assert (done.path / "labels.txt").read_text() == expected and manifest.outputs["scores"].endswith(":2")


def test_the_command_line_flags(tmp_path, capsys):
    model = write(tmp_path / "y.tflite", yolo_stub([Out("o", 84, scale=0.05, zero_point=-128)], size=320))
    code = main(["import", str(model), "--name", "y", "--out", str(tmp_path), "--box-scale", "pixels",
                 "--min-score", "0.3", "--max-detections", "50", "--nms-iou", "0.5", "--class-agnostic"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "detector: Ultralytics YOLO (one tensor), 80 classes" in err
    detection = json.loads((tmp_path / "y" / "model.json").read_text())["detection"]
    assert (detection["box_scale"], detection["min_score"], detection["max_detections"], detection["nms_iou"],
            detection["class_agnostic"]) == ("pixels", 0.3, 50, 0.5, True)
    code = main(["import", str(model), "--name", "z", "--out", str(tmp_path), "--output", "nonsense"])
    err = capsys.readouterr().err
    assert code == 1 and "give ROLE=TENSOR" in err and "Traceback" not in err


def _options(**given):
    from app.importing.detectors import DetectorOptions

    return DetectorOptions(**given)


# ---- real exports: known boxes on every backend -----------------------------------------------------------------------

def _run(interpreter, pixels: np.ndarray) -> dict[str, tuple[np.ndarray, tuple[float, int]]]:
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    scale, zero_point = detail["quantization"]
    x = pixels / 255.0 / scale + zero_point
    info = np.iinfo(detail["dtype"])
    interpreter.set_tensor(detail["index"], np.clip(np.round(x), info.min, info.max).astype(detail["dtype"])[None])
    interpreter.invoke()
    return {d["name"]: (interpreter.get_tensor(d["index"]).copy(), d["quantization"])
            for d in interpreter.get_output_details()}


def _decode(manifest, outputs) -> yolo.Rows:
    raw = {role: yolo.Raw(outputs[name][0], *outputs[name][1]) for role, name in manifest.outputs.items()}
    return yolo.decode(manifest.detection, raw, manifest.input.width, manifest.input.height, min_score=0.5)


EXPORTS = {
    "frigate int8": dict(builder="frigate_like"),
    "frigate uint8": dict(builder="frigate_like", io_type="uint8"),
    "ultralytics": dict(builder="ultralytics_like"),
    "ultralytics transposed pixels": dict(builder="ultralytics_like", transposed=True, box_scale="pixels"),
    "ultralytics float output": dict(builder="ultralytics_like", output_type="float32"),
}
# How far the squares' boxes may land from the squares, in input pixels. The Coral layout's bins are decoded here
# in float: exact but for the bins' quantization. Ultralytics' layout decodes inside the int8 graph, and its
# expected-bin FULLY_CONNECTED holds the weights 0..15 at int8 (scale 15/127: the weight 1 becomes 0.945), so a
# side of half a cell comes out as 0.47: a square on the stride-32 grid loses about 1 px a side.
EXPORT_TOLERANCE_PX = {"frigate": 0.5, "ultralytics": 1.5}


@pytest.mark.slow
@pytest.mark.parametrize("export", list(EXPORTS))
def test_each_yolo_export_imports_and_finds_the_squares_on_cpu_and_emulated(tmp_path, export):
    from ai_edge_litert.interpreter import Interpreter

    from app.emulator import Interpreter as Emulator
    from tests import yolo_models
    from tests.reference_worker import ReferenceWorker

    given = dict(EXPORTS[export])
    data = getattr(yolo_models, given.pop("builder"))(**given)
    labels = write(tmp_path / "labels.txt", "red\ngreen\nblue\n")
    manifest = imported(tmp_path, data, labels=labels)[0]
    pixels = yolo_models.squares()
    cpu = _run(Interpreter(model_content=data, num_threads=1), pixels)
    emulated = _run(Emulator(model_content=data), pixels)
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        detail = Interpreter(model_content=data).get_input_details()[0]
        scale, zero_point = detail["quantization"]
        info = np.iinfo(detail["dtype"])
        x = np.clip(np.round(pixels / 255.0 / scale + zero_point), info.min, info.max).astype(detail["dtype"])[None]
        reference = worker.run(data, [x])
    finally:
        worker.close()
    names = list(cpu)
    for name, want in zip(names, reference):
        assert emulated[name][0].tobytes() == want.tobytes(), name   # the emulator: byte for byte
    expected = [s.box for s in sorted(yolo_models.SCENE, key=lambda s: s.side)]  # equal scores: candidate order
    tolerance = EXPORT_TOLERANCE_PX[export.split()[0]]
    for outputs in (cpu, emulated):
        rows = _decode(manifest, outputs)
        assert rows.classes.tolist() == [s.colour for s in sorted(yolo_models.SCENE, key=lambda s: s.side)]
        np.testing.assert_allclose(rows.boxes * yolo_models.SIZE, np.array(expected) * yolo_models.SIZE,
                                   atol=tolerance)
    np.testing.assert_allclose(_decode(manifest, cpu).boxes * 64, _decode(manifest, emulated).boxes * 64, atol=1.0)


@pytest.mark.slow
def test_a_tf2_object_detection_export_with_pack_imports_in_tf2_order_and_finds_the_squares(tmp_path):
    """Its outputs by role from the op (TF2 lists them scores, boxes, count, classes), a `???` labelmap, the PACK
    where the Edge TPU's part ends; the squares found on cpu, and the emulator byte for byte with TFLite's reference
    kernels up to `count` (PACK included)."""
    from ai_edge_litert.interpreter import Interpreter

    from app.emulator import Interpreter as Emulator
    from tests import yolo_models
    from tests.reference_worker import ReferenceWorker

    data = yolo_models.tf2_ssd()
    manifest, done = imported(tmp_path, data, labels=write(tmp_path / "l.txt", "???\nred\ngreen\n"))
    assert manifest.detection.decoder == "postprocess" and manifest.detection.classes == 2
    assert read_model_dir(done.path).labels == ("red", "green")
    assert manifest.edgetpu_analysis.startswith("first unsupported op: PACK")
    pixels = yolo_models.squares(yolo_models.SSD_SCENE, yolo_models.SSD_SIZE)
    outputs = _run(Interpreter(model_content=data, num_threads=1), pixels)
    by_role = {role: outputs[name][0] for role, name in manifest.outputs.items()}
    count = int(by_role["count"][0])
    assert count == 2 and by_role["classes"][0, :count].tolist() == [1.0, 0.0]
    np.testing.assert_allclose(by_role["boxes"][0, :count] * 32,
                               np.array([yolo_models.SSD_SCENE[1].box, yolo_models.SSD_SCENE[0].box]) * 32, atol=0.5)
    emulated = _run(Emulator(model_content=data), pixels)
    worker = ReferenceWorker("BUILTIN_REF")
    try:
        reference = dict(zip(outputs, worker.run(data, [pixels[None]])))
    finally:
        worker.close()
    for role, name in manifest.outputs.items():  # rows past `count` are what each runtime left there
        width = 4 if role == "boxes" else 1
        rows = emulated[name][0].reshape(-1, width)[:count]
        assert rows.tobytes() == reference[name].reshape(-1, width)[:count].tobytes(), role
