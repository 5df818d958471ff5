"""app/importing/tasks.py through `python -m converter import`: segmentation and pose read from the graph,
float parts around 8-bit layers taken (MoveNet's), what only --task can tell asked for, and PoseNet's decoder, float
and dynamic-range models refused with the reason.

The files are graphs of a few operators built here (tests/tflite_builder.py), in the shapes of Coral's DeepLab
(an ARG_MAX int64 class map), a U-Net (per-pixel scores at the input's size), MoveNet SinglePose (a uint8 input
without quantization cast to float, float SQRT/DIV between 8-bit layers, float32 [1, 1, 17, 3]) and PoseNet (its
PosenetDecoderOp custom op).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.edgetpu.compat import analyze_file
from app.model_dir.reading import read_model_dir
from app.tasks.pose import KEYPOINT_NAMES
from converter.importer import ImportOptions, ImportRefused, import_model
from tests.test_converter_import import run, write
from tests.tflite_builder import GraphBuilder

PASCAL = ["background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
          "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor"]
# Coral's pascal_voc_segmentation_labels.txt: the 21 labels, a blank line, and a note on the ignore label
PASCAL_FILE = "\n".join(PASCAL) + ("\n\nand 255 is the ignore label that marks pixels excluded from learning and\n"
                                   "evaluation by the PASCAL VOC ground truth.\n")


def segmenter(size: int = 8, classes: int = 21, form: str = "argmax", map_size: int | None = None,
              out_type: str = "INT64", axis: int = 3) -> bytes:
    """uint8 image -> QUANTIZE -> CONV_2D 1x1 (class scores) [-> RESIZE_BILINEAR to map_size] -> ARG_MAX
    (form "argmax") or the scores themselves (form "scores")."""
    map_size = map_size or size
    g = GraphBuilder()
    image = g.tensor("image", [1, size, size, 3], "UINT8", scale=1 / 128, zero_point=128)
    x = g.tensor("image/int8", [1, size, size, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("QUANTIZE", [image], [x])
    w = g.tensor("w", [classes, 1, 1, 3], "INT8", scale=[0.01] * classes, zero_point=[0] * classes,
                 data=np.arange(classes * 3).reshape(classes, 1, 1, 3) % 7 - 3)
    b = g.tensor("b", [classes], "INT32", scale=[0.01 / 128] * classes, zero_point=[0] * classes,
                 data=np.zeros(classes))
    scores = g.tensor("scores", [1, size, size, classes], "INT8", scale=0.05, zero_point=0)
    g.op("CONV_2D", [x, w, b], [scores], padding="VALID", strideW=1, strideH=1, dilationWFactor=1,
         dilationHFactor=1)
    if map_size != size:
        resized = g.tensor("ResizeBilinear", [1, map_size, map_size, classes], "INT8", scale=0.05, zero_point=0)
        g.op("RESIZE_BILINEAR", [scores, g.constant("size", [map_size, map_size])], [resized], "ResizeBilinearOptions",
             alignCorners=True)
        scores = resized
    if form == "scores":
        return g.build([image], [scores])
    out = g.tensor("ArgMax", [1, map_size, map_size], out_type)
    g.op("ARG_MAX", [scores, g.constant("ArgMax/dimension", axis, shape=[])], [out],
         "ArgMaxOptions", outputType=4 if out_type == "INT64" else 2)
    return g.build([image], [out])


def movenet_like(keypoints: int = 17, shape: tuple[int, ...] | None = None, float_ops: bool = True,
                 raw: bool = True) -> bytes:
    """MoveNet SinglePose's frame: a uint8 input without quantization -> CAST -> QUANTIZE -> CONV_2D (int8) ->
    DEQUANTIZE -> SQRT (float) -> QUANTIZE -> RESHAPE -> DEQUANTIZE -> float32 [1, 1, keypoints, 3]."""
    shape = shape or (1, 1, keypoints, 3)
    size, channels = 4, int(np.prod(shape))
    g = GraphBuilder()
    if raw:
        image = g.tensor("serving_default_input:0", [1, size, size, 3], "UINT8")
        cast = g.tensor("Cast", [1, size, size, 3], "FLOAT32")
        g.op("CAST", [image], [cast])
        x = g.tensor("tfl.quantize", [1, size, size, 3], "INT8", scale=1.0, zero_point=-128)
        g.op("QUANTIZE", [cast], [x])
    else:
        image = g.tensor("image", [1, size, size, 3], "UINT8", scale=1 / 128, zero_point=128)
        x = g.tensor("tfl.quantize", [1, size, size, 3], "INT8", scale=1 / 128, zero_point=0)
        g.op("QUANTIZE", [image], [x])
    w = g.tensor("w", [channels, size, size, 3], "INT8", scale=[0.01] * channels, zero_point=[0] * channels,
                 data=np.ones((channels, size, size, 3)))
    b = g.tensor("b", [channels], "INT32", scale=[0.01] * channels, zero_point=[0] * channels, data=np.zeros(channels))
    conv = g.tensor("heads", [1, 1, 1, channels], "INT8", scale=0.05, zero_point=-128)
    g.op("CONV_2D", [x, w, b], [conv], padding="VALID", strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    if float_ops:
        real = g.tensor("heads/float", [1, 1, 1, channels], "FLOAT32")
        g.op("DEQUANTIZE", [conv], [real])
        root = g.tensor("Sqrt", [1, 1, 1, channels], "FLOAT32")
        g.op("SQRT", [real], [root])
        conv = g.tensor("Sqrt/quantized", [1, 1, 1, channels], "INT8", scale=0.05, zero_point=-128)
        g.op("QUANTIZE", [root], [conv])
    reshaped = g.tensor("keypoints/int8", list(shape), "INT8", scale=0.05, zero_point=-128)
    g.op("RESHAPE", [conv, g.constant("shape", list(shape))], [reshaped], newShape=list(shape))
    out = g.tensor("StatefulPartitionedCall:0", list(shape), "FLOAT32")
    g.op("DEQUANTIZE", [reshaped], [out])
    return g.build([image], [out])


def posenet_like() -> bytes:
    """An 8-bit backbone ending in Coral's PosenetDecoderOp, with its four float outputs."""
    g = GraphBuilder()
    image = g.tensor("sub_2", [1, 8, 8, 3], "UINT8", scale=1 / 128, zero_point=128)
    heat = g.tensor("heatmaps", [1, 8, 8, 17], "UINT8", scale=0.05, zero_point=128)
    w = g.tensor("w", [17, 1, 1, 3], "UINT8", scale=0.01, zero_point=128, data=np.full((17, 1, 1, 3), 130))
    b = g.tensor("b", [17], "INT32", scale=0.01 / 128, zero_point=0, data=np.zeros(17))
    g.op("CONV_2D", [image, w, b], [heat], padding="VALID", strideW=1, strideH=1, dilationWFactor=1,
         dilationHFactor=1)
    outs = [g.tensor("poses" + (f":{i}" if i else ""), [], "FLOAT32") for i in range(4)]
    g.op("CUSTOM", [heat], outs, custom_code="PosenetDecoderOp")
    return g.build([image], outs)


def dynamic_range() -> bytes:
    """A float input into a CONV_2D with int8 weights and float output: dynamic-range quantized."""
    g = GraphBuilder()
    image = g.tensor("image", [1, 4, 4, 3], "FLOAT32")
    w = g.tensor("w", [2, 1, 1, 3], "INT8", scale=[0.01] * 2, zero_point=[0] * 2, data=np.ones((2, 1, 1, 3)))
    b = g.tensor("b", [2], "FLOAT32", data=np.zeros(2))
    out = g.tensor("out", [1, 4, 4, 2], "FLOAT32")
    g.op("CONV_2D", [image, w, b], [out], padding="VALID", strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    return g.build([image], [out])


# ---- segmentation --------------------------------------------------------------------------------------------

def test_an_argmax_class_map_is_segmentation_with_coral_pascal_labels(tmp_path, capsys):
    model = write(tmp_path / "deeplab.tflite", segmenter(size=8, classes=21, map_size=16))
    labels = write(tmp_path / "pascal_voc_segmentation_labels.txt", PASCAL_FILE)
    code, _, err = run(capsys, "import", model, "--name", "deeplab", "--out", tmp_path, "--labels", labels)
    assert code == 0, err  # the ARG_MAX after the Edge TPU's part is the model's own end, as intended
    directory = read_model_dir(tmp_path / "deeplab")
    m = directory.manifest
    assert (m.task, m.outputs) == ("segmentation", {"class_map": "ArgMax"})
    assert directory.labels == tuple(PASCAL)
    assert "ARG_MAX over the 21 channels" in m.imported.task and "a class map" in m.imported.task
    assert any("taken as a note, not labels" in note for note in m.imported.notes)
    assert (m.input.mean, m.input.std, m.input.resize) == ([128], [128], "stretch")
    assert "the CPU runs ARG_MAX after it, as intended" in m.edgetpu_analysis
    assert "task: segmentation" in err


def test_a_class_map_without_labels_keeps_its_class_count_in_blank_lines(tmp_path):
    model = write(tmp_path / "m.tflite", segmenter(classes=5))
    done = import_model([model], ImportOptions(name="m", out=tmp_path))
    assert read_model_dir(done.path).labels == ("",) * 5


def test_labels_with_a_background_line_the_map_does_not_have_are_shifted(tmp_path):
    """Coral's cityscapes_segmentation_labels.txt: 'background' and 19 names for a map of 19 classes."""
    model = write(tmp_path / "m.tflite", segmenter(classes=19))
    names = ["road", "sidewalk", "building"] + [f"class {i}" for i in range(3, 19)]
    labels = write(tmp_path / "labels.txt", "\n".join(["background", *names]) + "\n")
    done = import_model([model], ImportOptions(name="m", out=tmp_path, labels=labels))
    assert read_model_dir(done.path).labels[:3] == ("road", "sidewalk", "building")
    assert any("background class" in note for note in done.notes)


def test_per_pixel_scores_at_the_input_size_are_segmentation(tmp_path):
    done = import_model([write(tmp_path / "unet.tflite", segmenter(size=8, classes=3, form="scores"))],
                        ImportOptions(name="unet", out=tmp_path))
    m = read_model_dir(done.path).manifest
    assert (m.task, m.outputs) == ("segmentation", {"class_map": "scores"})
    assert "3 class scores per pixel (at the input's size)" in m.imported.task


def test_smaller_per_pixel_scores_ask_for_the_task(tmp_path, capsys):
    model = write(tmp_path / "heat.tflite", segmenter(size=16, classes=17, form="scores", map_size=4))
    code, out, err = run(capsys, "import", model, "--name", "heat", "--out", tmp_path)
    assert code == 1 and "smaller than the 16x16 input" in err and "give --task segmentation" in err
    assert not (tmp_path / "heat").exists() and out == ""
    code, _, err = run(capsys, "import", model, "--name", "heat", "--out", tmp_path, "--task", "segmentation")
    assert code == 0, err
    assert read_model_dir(tmp_path / "heat").manifest.imported.task.endswith(
        "(--task segmentation as given): the class of a pixel is the highest-scoring one")


@pytest.mark.parametrize(("model", "expected"), [
    (lambda: segmenter(axis=1), "is not a class map"),
    (lambda: segmenter(out_type="INT32"), None),
])
def test_an_argmax_over_another_axis_is_refused(tmp_path, model, expected):
    path = write(tmp_path / "m.tflite", model())
    if expected is None:
        assert read_model_dir(import_model([path], ImportOptions(name="m", out=tmp_path)).path).manifest.task == \
            "segmentation"
        return
    with pytest.raises(ImportRefused, match=expected):
        import_model([path], ImportOptions(name="m", out=tmp_path))


# ---- pose ----------------------------------------------------------------------------------------------------

def test_movenet_singlepose_imports_as_pose_with_its_float_parts_and_raw_input(tmp_path, capsys):
    model = write(tmp_path / "movenet_single_pose_lightning_ptq.tflite", movenet_like())
    code, out, err = run(capsys, "import", model, "--name", "movenet", "--out", tmp_path)
    # written; as with Coral's own file, 8-bit operators after the first float one run on the CPU: exit 3 says so
    assert code == 3 and "DEQUANTIZE" in out, err
    directory = read_model_dir(tmp_path / "movenet")
    m = directory.manifest
    assert (m.task, m.outputs) == ("pose", {"keypoints": "StatefulPartitionedCall:0"})
    assert directory.labels == KEYPOINT_NAMES
    assert (m.input.mean, m.input.std, m.input.resize) == ([0.0], [1.0], "stretch")
    assert "casts it to float itself" in m.imported.input
    assert any("float operators (SQRT)" in note for note in m.imported.notes)
    assert "COCO's 17 keypoint names" in m.imported.labels
    # the CAST and QUANTIZE of the raw input run on the CPU before the Edge TPU's part, as edgetpu_compiler leaves them
    report = analyze_file(model)
    assert report.head == 2 and report.mapped == 1 and report.first_unsupported.opcode == "DEQUANTIZE"


def test_pose_labels_may_rename_the_17_keypoints_only(tmp_path):
    model = write(tmp_path / "m.tflite", movenet_like())
    ok = write(tmp_path / "ok.txt", "\n".join(f"k{i}" for i in range(17)) + "\n")
    assert read_model_dir(import_model([model], ImportOptions(name="a", out=tmp_path, labels=ok)).path).labels[0] == "k0"
    bad = write(tmp_path / "bad.txt", "a\nb\n")
    with pytest.raises(ImportRefused, match="has 2 labels, the model has 17 keypoints"):
        import_model([model], ImportOptions(name="b", out=tmp_path, labels=bad))


@pytest.mark.parametrize(("model", "expected"), [
    (lambda: movenet_like(keypoints=13), "has 13 keypoints: the service reads 17 COCO keypoints"),
    (lambda: movenet_like(shape=(1, 6, 56)), "is MoveNet MultiPose's"),
    (posenet_like, "ends in PosenetDecoderOp (operator #1), Coral's own custom operator"),
    (dynamic_range, "is dynamic-range quantized, not full-integer"),
])
def test_what_the_service_cannot_serve_is_refused_with_the_reason(tmp_path, capsys, model, expected):
    code, out, err = run(capsys, "import", write(tmp_path / "m.tflite", model()), "--name", "m", "--out",
                         tmp_path / "models")
    assert code == 1 and expected in err, err
    assert out == "" and not (tmp_path / "models" / "m").exists()


def test_the_posenet_refusal_says_why_and_what_to_use_instead(tmp_path):
    with pytest.raises(ImportRefused) as refused:
        import_model([write(tmp_path / "p.tflite", posenet_like())], ImportOptions(name="p", out=tmp_path))
    message = str(refused.value)
    assert "libcoral's posenet_decoder.so" in message and "movenet_single_pose_lightning_ptq.tflite" in message


# ---- --task ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "task", "expected"), [
    (lambda: segmenter(), "pose", "is a segmentation model"),
    (lambda: movenet_like(), "segmentation", "is a pose model"),
    (lambda: movenet_like(), "classification", "is a pose model"),
    (lambda: segmenter(form="scores", classes=3, size=1), "segmentation", "does not fit --task segmentation"),
    (lambda: segmenter(form="scores", classes=3, size=1), "pose", "does not fit --task pose"),
])
def test_a_task_the_graph_contradicts_is_refused_with_what_it_needs(tmp_path, model, task, expected):
    with pytest.raises(ImportRefused, match=expected) as refused:
        import_model([write(tmp_path / "m.tflite", model())], ImportOptions(name="m", out=tmp_path, task=task))
    assert "needs" in str(refused.value)


def test_a_classifier_named_by_task_imports_as_before(tmp_path):
    from tests.classifier_models import tiny_classifier

    model = write(tmp_path / "c.tflite", tiny_classifier(style="tf1"))
    done = import_model([model], ImportOptions(name="c", out=tmp_path, task="classification"))
    assert json.loads((done.path / "model.json").read_text())["task"] == "classification"
    with pytest.raises(ImportRefused, match="is a classification model .*--task detection needs"):
        import_model([model], ImportOptions(name="d", out=tmp_path, task="detection"))


def test_a_raw_uint8_input_the_model_does_not_cast_is_still_refused(tmp_path):
    g = GraphBuilder()
    image = g.tensor("image", [1, 4, 4, 3], "UINT8")
    out = g.tensor("flat", [1, 48], "UINT8", scale=0.1, zero_point=0)
    g.op("RESHAPE", [image, g.constant("shape", [1, 48])], [out], newShape=[1, 48])
    with pytest.raises(ImportRefused, match="without quantization parameters"):
        import_model([write(tmp_path / "m.tflite", g.build([image], [out]))], ImportOptions(name="m", out=tmp_path))
