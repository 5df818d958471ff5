"""The .tflite reader against the committed model (cross-checked with the real interpreter)."""

from collections import Counter

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from app.detection_postprocess import POSTPROCESS_OP
from app.tflite_file import TfliteFileError, read_tflite
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.detection_models import DEFAULT_OPTIONS, tiny_detector
from tests.doubles.compiled_model_double import CUSTOM_OP, compiled_model_bytes
from tests.tflite_builder import GraphBuilder

MODEL = MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite"


@pytest.fixture(scope="module")
def model():
    return read_tflite(MODEL)


@pytest.fixture(scope="module")
def interpreter():
    # no default delegate: its node would be listed among the model's own operators
    interpreter = Interpreter(model_path=str(MODEL),
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    return interpreter


def test_operators_match_the_interpreter(model, interpreter):
    ours = [op.opcode for op in model.graph.operators]
    theirs = [op["op_name"] for op in interpreter._get_ops_details()]  # noqa: SLF001
    assert ours == theirs
    assert Counter(ours) == {"CONV_2D": 33, "DEPTHWISE_CONV_2D": 16, "ADD": 9, "QUANTIZE": 2, "MEAN": 1,
                             "FULLY_CONNECTED": 1}


def test_tensors_match_the_interpreter(model, interpreter):
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    for tensor in model.graph.tensors:
        detail = details[tensor.index]
        assert tensor.name == detail["name"]
        assert tensor.shape == tuple(detail["shape"])
        assert tensor.dtype == np.dtype(detail["dtype"])
        params = detail["quantization_parameters"]
        if tensor.quantization is None:
            assert params["scales"].size == 0
        else:
            np.testing.assert_array_equal(tensor.quantization.scale, params["scales"])
            np.testing.assert_array_equal(tensor.quantization.zero_point, params["zero_points"])
            assert tensor.quantization.axis == params["quantized_dimension"]


def test_constant_data_is_the_interpreters(model, interpreter):
    conv = next(op for op in model.graph.operators if op.opcode == "CONV_2D")
    weights, bias = (model.graph.tensors[i] for i in conv.inputs[1:3])
    assert weights.type == "INT8" and weights.quantization.per_channel
    np.testing.assert_array_equal(weights.data, interpreter.get_tensor(weights.index))
    np.testing.assert_array_equal(bias.data, interpreter.get_tensor(bias.index))
    assert bias.data.dtype == np.int32


def test_builtin_options_by_schema_name(model):
    stem = model.graph.operators[1]
    assert stem.opcode == "CONV_2D"
    assert stem.options["strideW"] == stem.options["strideH"] == 2
    assert stem.options["dilationWFactor"] == 1
    mean = next(op for op in model.graph.operators if op.opcode == "MEAN")
    assert mean.options == {"keepDims": False}


def test_io_and_static_shapes(model):
    graph = model.graph
    (inp,), (out,) = graph.inputs, graph.outputs
    assert graph.tensors[inp].shape == (1, 224, 224, 3) and graph.tensors[inp].type == "UINT8"
    assert graph.tensors[out].shape == (1, 1000)
    assert not any(t.is_dynamic for t in graph.tensors)


def test_custom_ops_keep_their_code_and_options():
    model = read_tflite(compiled_model_bytes(min_runtime_version=13))
    (op,) = model.graph.operators
    assert op.custom and op.opcode == CUSTOM_OP and op.custom_options


def test_custom_options_read_as_a_flexbuffer_map(model):
    detector = read_tflite(tiny_detector(max_detections=7, use_regular_nms=True))
    op = detector.graph.operators[-1]
    assert op.custom and op.opcode == POSTPROCESS_OP
    assert op.custom_options_map() == {**DEFAULT_OPTIONS, "max_detections": 7, "use_regular_nms": True}
    assert model.graph.operators[0].custom_options_map() == {}  # a builtin operator: none


@pytest.mark.parametrize("options", [b"\x01\x02\x03", b"\x05\x0c\x01"])
def test_custom_options_that_are_no_flexbuffer_map_are_refused(options):
    g = GraphBuilder()
    x, y = g.tensor("x", [1, 4], "FLOAT32"), g.tensor("y", [1, 4], "FLOAT32")
    g.op("CUSTOM", [x], [y], custom_code="Mine")
    g.operators[-1].customOptions = list(options)
    (op,) = read_tflite(g.build([x], [y])).graph.operators
    assert op.custom_options == options
    with pytest.raises(TfliteFileError, match="#0 Mine: custom options"):
        op.custom_options_map()


@pytest.mark.parametrize("data", [b"", b"not a model at all", MODEL.read_bytes()[:4096]])
def test_what_is_not_a_model_is_refused(data):
    with pytest.raises(TfliteFileError):
        read_tflite(data)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(TfliteFileError, match="cannot read"):
        read_tflite(tmp_path / "absent.tflite")
