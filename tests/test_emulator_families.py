"""Whole models shaped like each family Coral owners bring (tests/emulator_families.py), converted as their exporters
convert them, byte-exact on the emulator against BUILTIN_REF: every tensor of every operator, on random images and
on a photo.

TF2 Object Detection API SSD (PACK upsampling, TFLite_Detection_PostProcess, TF2's output order), YOLO in Ultralytics'
single-tensor layout (SiLU, HARD_SWISH, and the PyTorch route; YOLO11's C2PSA attention in both forms its exports take)
and in Frigate's two-tensor Coral layout, a DeepLab-like
segmenter ending in an int64 ARG_MAX, and a MoveNet-like pose model with its float32 tail.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from app.emulator import Interpreter
from tests import emulator_families as families
from tests.emulator_cases import reference  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built() -> dict:
    """Each family's model, converted once per session (3-5 s each, the torch route ~10 s)."""
    return {}


def model(built: dict, name: str) -> bytes:
    if name not in built:
        builder, *arguments = {
            "ssd_tf2": (families.ssd_tf2,), "yolo_silu": (families.yolo_ultralytics, "silu"),
            "yolo_hard_swish": (families.yolo_ultralytics, "hard_swish"), "yolo_frigate": (families.yolo_frigate,),
            "yolo_torch": (families.yolo_torch,), "segmenter": (families.segmenter,), "pose": (families.pose,),
            "yolo11_batched": (families.yolo11, "batched"), "yolo11_per_head": (families.yolo11, "per_head"),
            "pose_int8_tail": (families.pose, ()),
        }[name]
        built[name] = builder(*arguments)
    return built[name]


def inputs_for(interpreter: Interpreter, seed: int) -> list[np.ndarray]:
    """Random pixels, or (seed 0) a photo resized to the input: real images put the model where it works."""
    from PIL import Image

    from converter.photos import photo

    tensors = []
    for detail in interpreter.get_input_details():
        _, height, width, _ = detail["shape"]
        if seed == 0:
            pixels = np.asarray(Image.open(photo("scikit-image", "skimage/data/chelsea.png")).convert("RGB")
                                .resize((width, height), Image.BILINEAR))
            values = pixels.astype(np.int16) - (128 if detail["dtype"] == np.int8 else 0)
        else:
            values = np.random.default_rng(seed).integers(0, 256, detail["shape"]) - (
                128 if detail["dtype"] == np.int8 else 0)
        tensors.append(values.reshape(detail["shape"]).astype(detail["dtype"]))
    return tensors


def assert_every_tensor_matches(reference, content: bytes, seeds=(0, 1, 2)) -> Interpreter:
    interpreter = Interpreter(model_content=content)
    for seed in seeds:
        inputs = inputs_for(interpreter, seed)
        expected = reference.run(content, inputs, all_tensors=True)
        assert isinstance(expected, dict), expected
        interpreter.allocate_tensors()
        for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
            interpreter.set_tensor(detail["index"], x)
        interpreter.invoke()
        for step in interpreter.plan.steps:
            for index in step.outputs:
                got, want = interpreter.get_tensor(index), expected[index]
                assert got.dtype == want.dtype and got.shape == want.shape, (step.operator.opcode, index)
                assert got.tobytes() == want.tobytes(), (
                    f"seed {seed}: operator #{step.operator.index} {step.operator.opcode} differs in tensor {index}")
    return interpreter


def opcodes(interpreter: Interpreter) -> Counter:
    return Counter(interpreter.plan.opcodes)


def test_tf2_object_detection_api_ssd(reference, built):
    from app.detection_postprocess import outputs_by_role

    content = model(built, "ssd_tf2")
    interpreter = assert_every_tensor_matches(reference, content)
    ops = opcodes(interpreter)
    assert ops["PACK"] == 2 and ops["TFLite_Detection_PostProcess"] == 1 and ops["LOGISTIC"] == 1
    graph = interpreter.model.graph
    roles = outputs_by_role(graph)
    assert list(graph.outputs) == [roles[r].index for r in ("scores", "boxes", "count", "classes")]  # TF2's order
    counts = [int(interpreter.get_tensor(roles["count"].index)[0])]
    assert max(counts) > 0  # detections to compare, not an empty output


@pytest.mark.parametrize("name", ["yolo_silu", "yolo_hard_swish"])
def test_yolo_ultralytics_layout(reference, built, name):
    interpreter = assert_every_tensor_matches(reference, model(built, name))
    ops = opcodes(interpreter)
    assert {"SPLIT", "SPLIT_V", "SOFTMAX", "TRANSPOSE", "MAX_POOL_2D", "RESIZE_NEAREST_NEIGHBOR", "PAD"} <= set(ops)
    assert ("HARD_SWISH" in ops) == (name == "yolo_hard_swish")
    (output,) = interpreter.get_output_details()
    cells = (families.YOLO_SIZE // 8) ** 2 + (families.YOLO_SIZE // 16) ** 2
    assert tuple(output["shape"]) == (1, 4 + families.YOLO_CLASSES, cells)


def _matrix_products(interpreter: Interpreter) -> list[tuple[str, tuple[str, ...]]]:
    """Each FULLY_CONNECTED and BATCH_MATMUL with the kind of each operand: constant or computed."""
    graph = interpreter.model.graph
    return [(op.opcode, tuple("constant" if graph.tensors[i].data is not None else "computed"
                              for i in op.inputs if i >= 0))
            for op in graph.operators if op.opcode in ("FULLY_CONNECTED", "BATCH_MATMUL")]


@pytest.mark.parametrize("form", ["batched", "per_head"])
def test_yolo11_with_its_c2psa_attention(reference, built, form):
    """YOLO11's attention as onnx2tf's conversion writes it (full-integer, per tensor, int8 I/O): batched, two
    BATCH_MATMUL of computed int8 operands; unrolled per head, a BATCH_MATMUL (q's transpose folded in as adj_x)
    and a FULLY_CONNECTED whose filter is the softmax, per head. Every tensor equals BUILTIN_REF's."""
    interpreter = assert_every_tensor_matches(reference, model(built, f"yolo11_{form}"))
    products = [p for p in _matrix_products(interpreter) if p[1] != ("computed", "constant")]  # less the DFL's
    heads = families.YOLO11_HEADS
    if form == "batched":
        assert products == [("BATCH_MATMUL", ("computed", "computed"))] * 2
    else:
        assert products == [("BATCH_MATMUL", ("computed", "computed")),
                            ("FULLY_CONNECTED", ("computed", "computed"))] * heads
    graph = interpreter.model.graph
    assert {graph.tensors[i].type for i in (*graph.inputs, *graph.outputs)} == {"INT8"}
    assert not any(graph.tensors[op.inputs[1]].quantization.per_channel for op in graph.operators
                   if op.opcode == "CONV_2D")  # per tensor, as onnx2tf's quant_type "per-tensor"


def test_yolo_frigate_layout(reference, built):
    interpreter = assert_every_tensor_matches(reference, model(built, "yolo_frigate"))
    cells = (families.YOLO_SIZE // 8) ** 2 + (families.YOLO_SIZE // 16) ** 2
    shapes = sorted(tuple(d["shape"]) for d in interpreter.get_output_details())
    assert shapes == [(1, cells, families.YOLO_CLASSES), (1, cells, 4 * families.REG_MAX)]


def test_yolo_through_the_torch_route(reference, built):
    interpreter = assert_every_tensor_matches(reference, model(built, "yolo_torch"))
    assert interpreter.get_input_details()[0]["dtype"] == np.int8  # ai-edge-quantizer's int8 I/O
    assert {"SOFTMAX", "TRANSPOSE", "SLICE", "LOGISTIC"} <= set(opcodes(interpreter))


def test_segmenter_ending_in_an_int64_arg_max(reference, built):
    interpreter = assert_every_tensor_matches(reference, model(built, "segmenter"))
    ops = opcodes(interpreter)
    assert {"ARG_MAX", "AVERAGE_POOL_2D", "RESIZE_BILINEAR", "DEPTHWISE_CONV_2D", "CONCATENATION"} <= set(ops)
    (output,) = interpreter.get_output_details()
    size = families.SEGMENTER_SIZE
    assert output["dtype"] == np.int64 and tuple(output["shape"]) == (1, size, size)
    assert len(np.unique(interpreter.get_tensor(output["index"]))) > 1  # a map of several classes


def test_pose_with_movenets_float_tail(reference, built):
    interpreter = assert_every_tensor_matches(reference, model(built, "pose"))
    graph = interpreter.model.graph
    float_ops = {op.opcode for op in graph.operators
                 if any(graph.tensors[i].type == "FLOAT32" for i in (*op.inputs, *op.outputs) if i >= 0)}
    assert {"DEQUANTIZE", "LOGISTIC", "ARG_MAX", "GATHER_ND", "UNPACK", "CAST", "SQRT", "DIV", "MUL",
            "SUB"} <= float_ops
    assert {"FLOOR_DIV", "PACK"} <= set(opcodes(interpreter))
    (output,) = interpreter.get_output_details()
    assert output["dtype"] == np.float32 and tuple(output["shape"]) == (1, 1, families.POSE_KEYPOINTS, 3)


def test_pose_whose_tail_tf_quantizes(reference, built):
    """The same model converted with nothing kept in float, as TF 2.21 does by default: the tail's DIV and SQRT in
    int8 (MoveNet's own file keeps them float)."""
    interpreter = assert_every_tensor_matches(reference, model(built, "pose_int8_tail"))
    graph = interpreter.model.graph
    int8_ops = {op.opcode for op in graph.operators if graph.tensors[op.outputs[0]].type == "INT8"}
    assert {"DIV", "SQRT", "GATHER_ND", "LOGISTIC"} <= int8_ops
