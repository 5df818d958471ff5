"""The emulator's Interpreter: TFLite's interface, and byte-identical results on the default model.

The reference (BUILTIN_REF) runs in the reference worker subprocess; only the default model's
details are compared in-process (loading it with the optimized kernels is safe).
"""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as RealInterpreter
from ai_edge_litert.interpreter import OpResolverType

from app.emulator import Interpreter, InvalidTensor, UnsupportedOperators, supported_opcodes
from app.imaging import prepare
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from converter.photos import photo
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.emulator_cases import reference  # noqa: F401 (fixture)
from tests.tflite_builder import GraphBuilder

MODEL = MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite"
PHOTOS = [("scikit-image", "skimage/data/chelsea.png"), ("scikit-image", "skimage/data/coffee.png"),
          ("scikit-learn", "sklearn/datasets/images/china.jpg"), ("scikit-image", "skimage/data/astronaut.png"),
          ("scikit-learn", "sklearn/datasets/images/flower.jpg")]


@pytest.fixture(scope="module")
def emulator() -> Interpreter:
    interpreter = Interpreter(model_path=MODEL)
    interpreter.allocate_tensors()
    return interpreter


def photo_tensor(package: str, name: str) -> np.ndarray:
    """A real photo through the service's own preprocessing."""
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    spec = model_dir.manifest.input
    pixels = prepare(photo(package, name).read_bytes(), spec, 50_000_000)
    return InputQuantizer(spec, np.dtype(np.uint8), 1 / 128, 127)(pixels)


def run(interpreter, x: np.ndarray) -> np.ndarray:
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.mark.parametrize("package,name", PHOTOS, ids=[p[1].rsplit("/", 1)[1] for p in PHOTOS])
def test_default_model_is_byte_identical_on_real_photos(emulator, reference, package, name):
    x = photo_tensor(package, name)
    (expected,) = reference.run(MODEL.read_bytes(), [x])
    got = run(emulator, x)
    assert got.dtype == expected.dtype == np.uint8 and got.shape == expected.shape == (1, 1000)
    assert got.tobytes() == expected.tobytes()
    assert len(np.unique(got)) > 20  # a real spread of scores, not a collapsed model


def test_every_intermediate_tensor_is_identical(emulator, reference):
    x = photo_tensor(*PHOTOS[0])
    expected = reference.run(MODEL.read_bytes(), [x], all_tensors=True)
    run(emulator, x)
    produced = [i for step in emulator.plan.steps for i in step.outputs]
    assert len(produced) == 62
    for index in produced:
        assert emulator.get_tensor(index).tobytes() == expected[index].tobytes(), f"tensor {index}"


def test_the_cat_is_a_cat(emulator):
    scores = run(emulator, photo_tensor(*PHOTOS[0]))[0]
    top5 = np.argsort(scores)[::-1][:5]
    assert 282 in top5 or 281 in top5 or 285 in top5  # tiger cat, tabby, Egyptian cat


def test_details_are_the_real_interpreters(emulator):
    real = RealInterpreter(model_path=str(MODEL),
                           experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    real.allocate_tensors()
    pairs = [(emulator.get_input_details(), real.get_input_details()),
             (emulator.get_output_details(), real.get_output_details())]
    real_tensors = {d["index"]: d for d in real.get_tensor_details()}
    pairs.append(([d for d in emulator.get_tensor_details()], [real_tensors[d["index"]] for d in
                                                                emulator.get_tensor_details()]))
    for ours_list, theirs_list in pairs:
        assert len(ours_list) == len(theirs_list)
        for ours, theirs in zip(ours_list, theirs_list, strict=True):
            for key in ("name", "index", "dtype", "quantization"):
                assert ours[key] == theirs[key], (key, ours[key], theirs[key])
            np.testing.assert_array_equal(ours["shape"], theirs["shape"])
            np.testing.assert_array_equal(ours["shape_signature"], theirs["shape_signature"])
            for key in ("scales", "zero_points"):
                np.testing.assert_array_equal(ours["quantization_parameters"][key],
                                              theirs["quantization_parameters"][key])
            assert (ours["quantization_parameters"]["quantized_dimension"]
                    == theirs["quantization_parameters"]["quantized_dimension"])


def test_model_content_and_path_load_the_same_graph(emulator):
    from_bytes = Interpreter(model_content=MODEL.read_bytes())
    assert from_bytes.plan.opcodes == emulator.plan.opcodes
    with pytest.raises(ValueError, match="exactly one"):
        Interpreter()


def test_set_tensor_checks_dtype_shape_and_index(emulator):
    index = emulator.get_input_details()[0]["index"]
    with pytest.raises(InvalidTensor, match="got int8, expected uint8"):
        emulator.set_tensor(index, np.zeros((1, 224, 224, 3), np.int8))
    with pytest.raises(InvalidTensor, match=r"got shape \(1, 224, 224\)"):
        emulator.set_tensor(index, np.zeros((1, 224, 224), np.uint8))
    with pytest.raises(InvalidTensor, match="out of range"):
        emulator.get_tensor(10_000)


def test_invoke_needs_allocation_and_inputs():
    fresh = Interpreter(model_path=MODEL)
    with pytest.raises(RuntimeError, match="allocate_tensors"):
        fresh.invoke()
    fresh.allocate_tensors()
    with pytest.raises(RuntimeError, match="was not set"):
        fresh.invoke()


def test_unsupported_operators_fail_at_load_with_every_position():
    g = GraphBuilder()
    x = g.tensor("x", (1, 4, 4, 2), "INT8", scale=0.1, zero_point=0)
    t = g.tensor("t", (1, 4, 4, 2), "INT8", scale=0.1, zero_point=0)
    axis = g.constant("axis", [2])
    r = g.tensor("r", (1, 4, 4, 2), "INT8", scale=0.1, zero_point=0)
    f = g.tensor("f", (1, 4, 4, 2), "FLOAT32")
    g.op("REVERSE_V2", [x, axis], [t])
    g.op("RELU", [t], [r])
    g.op("DEQUANTIZE", [r], [f])
    g.op("FLOOR", [f], [g.tensor("out", (1, 4, 4, 2), "FLOAT32")])
    with pytest.raises(UnsupportedOperators) as raised:
        Interpreter(model_content=g.build([x], [5]))
    assert [(op.index, op.opcode) for op in raised.value.operators] == [(0, "REVERSE_V2"), (3, "FLOOR")]
    message = str(raised.value)
    assert "cannot run 2 operators" in message
    assert "REVERSE_V2 (operator 0), FLOOR (operator 3) not emulated" in message


def test_the_refusal_names_each_operator_once_on_one_line():
    """Issue 35: a TF2 detector with 4 PACKs was refused with the emulator's whole operator list 4 times (6 KB)."""
    g = GraphBuilder()
    x = g.tensor("x", (1, 2, 2, 4), "INT8", scale=0.1, zero_point=0)
    previous = x
    for i in range(4):
        packed = g.tensor(f"packed{i}", (1, 2, 2, 2, 4), "INT8", scale=0.1, zero_point=0)
        g.op("PACK", [previous, previous], [packed], "PackOptions", valuesCount=2, axis=3)
        previous = g.tensor(f"reshaped{i}", (1, 2, 2, 4), "INT8", scale=0.1, zero_point=0)
        g.op("REVERSE_V2", [packed, g.constant(f"axis{i}", [3])], [previous])
    with pytest.raises(UnsupportedOperators) as raised:
        Interpreter(model_content=g.build([x], [previous]))
    message = str(raised.value)
    missing = {op.opcode for op in raised.value.operators}
    assert "\n" not in message and len(message) < 400, message
    assert "REVERSE_V2 (operators 1, 3, 5, 7) not emulated" in message
    for opcode in missing:
        assert message.count(opcode) == 1
    assert "docs/emulator.md" in message and "python -m app.emulator" in message
    assert message.endswith("ask for it on the `cpu` backend (TFLite's own kernels) instead")  # who can serve it
    for opcode in set(supported_opcodes()) - missing:  # the supported list is pointed at, never repeated
        assert f" {opcode}," not in message


def test_refused_configurations_are_grouped_and_counted():
    from app.emulator.errors import REASONS_SHOWN, UnsupportedOperator

    problems = [UnsupportedOperator(i, "CONV_2D", "input is FLOAT32") for i in range(3)]
    problems += [UnsupportedOperator(10 + i, "MEAN", f"reason {i}") for i in range(REASONS_SHOWN + 2)]
    message = str(UnsupportedOperators(problems))
    assert "CONV_2D (operators 0, 1, 2): input is FLOAT32" in message
    assert "... and 3 more" in message and "MEAN (operator 10): reason 0" in message


def test_python_m_app_emulator_lists_the_operators_and_checks_models(tmp_path, capsys):
    from app.emulator.__main__ import main

    assert main([]) == 0
    assert capsys.readouterr().out.split() == supported_opcodes()
    assert main([str(MODEL)]) == 0
    assert "runs all 62 operators" in capsys.readouterr().out
    g = GraphBuilder()
    x = g.tensor("x", (1, 4), "INT8", scale=0.1, zero_point=0)
    g.op("REVERSE_V2", [x, g.constant("axis", [1])], [g.tensor("y", (1, 4), "INT8", scale=0.1, zero_point=0)])
    (tmp_path / "reverse.tflite").write_bytes(g.build([x], [2]))
    assert main([str(tmp_path / "reverse.tflite")]) == 1
    assert "REVERSE_V2 (operator 0) not emulated" in capsys.readouterr().out


def test_a_supported_op_with_an_unsupported_configuration_is_listed_too():
    g = GraphBuilder()
    x = g.tensor("x", (1, 8), "INT16", scale=0.1, zero_point=0)
    w = g.tensor("w", (4, 8), "INT8", scale=0.1, zero_point=0, data=np.zeros((4, 8), np.int8))
    g.op("FULLY_CONNECTED", [x, w, -1], [g.tensor("y", (1, 4), "INT16", scale=0.1, zero_point=0)],
         "FullyConnectedOptions")
    with pytest.raises(UnsupportedOperators,
                       match=r"FULLY_CONNECTED \(operator 0\): input 'x' is INT16; expected INT8 or UINT8"):
        Interpreter(model_content=g.build([x], [2]))


@pytest.mark.parametrize("opcode", ["RELU", "LEAKY_RELU", "HARD_SWISH", "QUANTIZE"])
def test_a_zero_scale_fails_the_load_as_unsupported(opcode):
    """A degenerate quantization (scale 0) would give infinite multipliers: a load error that says so."""
    from tests.emulator_cases import unary_model

    with pytest.raises(UnsupportedOperators,
                       match=rf"{opcode} \(operator 0\): output 'output' has scale 0.0; expected a positive"):
        Interpreter(model_content=unary_model(opcode, (1, 8), "INT8", (0.1, 0), (0.0, 0)))


def test_the_issue_op_list_is_covered():
    wanted = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM",
              "AVERAGE_POOL_2D", "MAX_POOL_2D", "MEAN", "SUM", "PAD", "RESHAPE", "SQUEEZE", "EXPAND_DIMS",
              "CONCATENATION", "SOFTMAX", "LOGISTIC", "TANH", "RELU", "RELU6", "HARD_SWISH", "QUANTIZE", "DEQUANTIZE",
              "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "STRIDED_SLICE", "SLICE", "SPACE_TO_DEPTH",
              "L2_NORMALIZATION", "LEAKY_RELU", "PRELU",
              # issue 14: the CPU-side ops of partially mapped models
              "PADV2", "TRANSPOSE", "GATHER", "GATHER_ND", "TRANSPOSE_CONV",
              # issues 37, 38: TF2 detectors, YOLO heads, DeepLab and MoveNet's float tail
              "PACK", "UNPACK", "SPLIT", "SPLIT_V", "TILE", "ARG_MAX", "ARG_MIN", "CAST", "DIV", "FLOOR_DIV",
              "FLOOR_MOD", "SQRT", "RSQRT"}
    assert wanted <= set(supported_opcodes())


def _small_cnn() -> bytes:
    """A Fashion-MNIST-shaped classifier: CONV_2D, MAX_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX, in one graph."""
    rng = np.random.default_rng(28)
    g = GraphBuilder()
    x = g.tensor("image", (1, 28, 28, 1), "INT8", scale=1 / 255, zero_point=-128)
    filter_scales = rng.uniform(0.005, 0.01, 8).astype(np.float32)
    w1 = g.tensor("conv/w", (8, 3, 3, 1), "INT8", scale=filter_scales, zero_point=[0] * 8,
                  data=rng.integers(-127, 128, (8, 3, 3, 1)))
    b1 = g.tensor("conv/b", (8,), "INT32", scale=np.float32(1 / 255) * filter_scales, zero_point=[0] * 8,
                  data=rng.integers(-500, 500, 8))
    c1 = g.tensor("conv", (1, 28, 28, 8), "INT8", scale=0.02, zero_point=-128)
    g.op("CONV_2D", [x, w1, b1], [c1], "Conv2DOptions", padding="SAME", strideH=1, strideW=1,
         fusedActivationFunction="RELU")
    p1 = g.tensor("pool", (1, 14, 14, 8), "INT8", scale=0.02, zero_point=-128)
    g.op("MAX_POOL_2D", [c1], [p1], "Pool2DOptions", padding="VALID", strideH=2, strideW=2, filterHeight=2,
         filterWidth=2)
    flat = g.tensor("flat", (1, 14 * 14 * 8), "INT8", scale=0.02, zero_point=-128)
    g.op("RESHAPE", [p1, g.constant("shape", [1, 14 * 14 * 8])], [flat], "ReshapeOptions", newShape=[1, 1568])
    w2 = g.tensor("dense/w", (10, 1568), "INT8", scale=0.004, zero_point=0, data=rng.integers(-127, 128, (10, 1568)))
    b2 = g.tensor("dense/b", (10,), "INT32", scale=float(np.float32(0.02 * 0.004)), zero_point=0,
                  data=rng.integers(-2000, 2000, 10))
    logits = g.tensor("logits", (1, 10), "INT8", scale=0.25, zero_point=3)
    g.op("FULLY_CONNECTED", [flat, w2, b2], [logits], "FullyConnectedOptions")
    probabilities = g.tensor("probabilities", (1, 10), "INT8", scale=1 / 256, zero_point=-128)
    g.op("SOFTMAX", [logits], [probabilities], "SoftmaxOptions", beta=1.0)
    return g.build([x], [probabilities])


def test_a_small_cnn_graph_chains_ops_exactly(reference):
    model = _small_cnn()
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 28, 28, 1)).astype(np.int8)
        expected = reference.run(model, [x], all_tensors=True)
        interpreter = Interpreter(model_content=model)
        interpreter.allocate_tensors()
        run(interpreter, x)
        assert interpreter.plan.opcodes == ["CONV_2D", "MAX_POOL_2D", "RESHAPE", "FULLY_CONNECTED", "SOFTMAX"]
        for step in interpreter.plan.steps:
            index = step.outputs[0]
            assert interpreter.get_tensor(index).tobytes() == expected[index].tobytes(), step.operator.opcode
        assert len(np.unique(expected[interpreter.model.graph.outputs[0]])) > 1


def test_a_model_with_dynamic_shapes_is_refused_naming_the_backend_to_ask():
    from app.emulator.errors import UnsupportedModel

    g = GraphBuilder()
    x = g.tensor("x", (1, 4), "INT8", scale=0.1, zero_point=0, signature=(-1, 4))
    y = g.tensor("y", (1, 4), "INT8", scale=0.1, zero_point=0, signature=(-1, 4))
    g.op("RELU", [x], [y])
    with pytest.raises(UnsupportedModel, match=r"dynamic shapes; .*ask for it on the `cpu` backend"):
        Interpreter(model_content=g.build([x], [y]))
