"""The offline Edge TPU analysis: one small graph per documented constraint, and the committed models."""

import json
from collections import Counter

import numpy as np
import pytest

from app.edgetpu.compat import MAX_SOFTMAX_ELEMENTS, analyze, analyze_file
from app.edgetpu.compiler_limits import (
    BILINEAR_SCALE,
    INNER_PLANE,
    MAPPED,
    MODEL_REFUSED,
    MORE_THAN_ONE_SUBGRAPH,
    NOT_AN_EDGETPU_OP,
    RESHAPE_VALUES,
    TRANSPOSE_VALUES,
    UNSPECIFIED_LIMITATION,
    UNSUPPORTED_DATA_TYPE,
)
from app.tflite_file import read_tflite
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.compiled_model_double import (
    compiled_detector_bytes,
    compiled_model_bytes,
    custom_options,
    package_bytes,
)
from tests.tflite_builder import GraphBuilder, conv_chain

CONV = dict(padding=0, strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)


def verdict_of(model_bytes: bytes, index: int = -1):
    report = analyze(read_tflite(model_bytes))
    return report.ops[index]


def unary(opcode: str, in_shape, out_shape, in_type="INT8", out_type="INT8", extra_inputs=(), **options) -> bytes:
    """One operator between an input and an output: extra_inputs are (name, values, type) constants."""
    g = GraphBuilder()
    x = g.activation("x", in_shape, in_type)
    constants = [g.constant(name, values, type) for name, values, type in extra_inputs]
    y = g.activation("y", out_shape, out_type)
    g.op(opcode, [x, *constants], [y], **options)
    return g.build([x], [y])


def assert_refused(model_bytes: bytes, *fragments: str, index: int = -1):
    verdict = verdict_of(model_bytes, index)
    assert not verdict.supported, verdict
    for fragment in fragments:
        assert fragment in verdict.reason, verdict.reason


def assert_accepted(model_bytes: bytes, index: int = -1):
    verdict = verdict_of(model_bytes, index)
    assert verdict.supported, verdict.reason


# ---- whole graphs -------------------------------------------------------------------------------

def test_the_committed_default_model_maps_whole():
    report = analyze_file(MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite")
    assert not report.compiled and report.first_unsupported is None
    assert report.mapped == report.total == 62
    assert report.summary() == "all 62 ops would run on the Edge TPU"


def test_an_unsupported_op_in_the_middle_strands_what_depends_on_it():
    clean = analyze(read_tflite(conv_chain()))
    assert clean.all_mapped and clean.total == 4
    report = analyze(read_tflite(conv_chain("HARD_SWISH")))
    assert [v.opcode for v in report.ops] == ["QUANTIZE", "CONV_2D", "HARD_SWISH", "CONV_2D", "QUANTIZE"]
    assert report.first_unsupported.index == 2 and report.mapped == 2 and report.total == 5
    assert report.summary() == "first unsupported op: HARD_SWISH at index 2; 2 of 5 ops would run on the Edge TPU"
    # the ops after it are supported in themselves, and still run on the CPU: they depend on it
    assert report.ops[3].supported and not report.on_edgetpu(3)
    assert [report.on_edgetpu(i) for i in range(5)] == [True, True, False, False, False]
    assert "use ReLU6" in report.first_unsupported.reason
    assert report.placement(3).startswith("depends on HARD_SWISH at index 2, which runs on the CPU")
    # the compiler's own words for each, as its operator table would give them
    assert [report.status(i) for i in range(5)] == [
        MAPPED, MAPPED, NOT_AN_EDGETPU_OP, MORE_THAN_ONE_SUBGRAPH, MORE_THAN_ONE_SUBGRAPH]


@pytest.mark.parametrize("opcode", ["DEQUANTIZE", "FLOOR_MOD"])
def test_operations_outside_the_table(opcode):
    out_type = "FLOAT32" if opcode == "DEQUANTIZE" else "INT8"
    assert_refused(unary(opcode, [1, 10], [1, 10], out_type=out_type), f"{opcode} is not an Edge TPU operation")


def test_a_custom_operator_other_than_the_edgetpu_one():
    g = GraphBuilder()
    x, y = g.activation("x", [1, 10]), g.activation("y", [1, 10])
    g.op("CUSTOM", [x], [y], custom_code="TFLite_Detection_PostProcess")
    assert_refused(g.build([x], [y]), "custom operator 'TFLite_Detection_PostProcess'")


def test_report_as_json():
    report = analyze(read_tflite(conv_chain("HARD_SWISH")))
    data = json.loads(report.to_json())
    assert data["mapped"] == 2 and data["total"] == 5 and data["compiled"] is False
    assert data["first_unsupported"]["opcode"] == "HARD_SWISH"
    assert data["ops"][3]["status"] == MORE_THAN_ONE_SUBGRAPH and data["unsure"] == []
    assert [op["on_edgetpu"] for op in data["ops"]] == [True, True, False, False, False]
    assert data["summary"] == report.summary()


def test_a_graph_without_operators():
    g = GraphBuilder()
    x = g.activation("x", [1, 4])
    report = analyze(read_tflite(g.build([x], [x])))
    assert report.total == report.mapped == 0 and report.summary() == "the graph has no operators"


# ---- compiled models ----------------------------------------------------------------------------

def test_a_compiled_model_is_recognised():
    report = analyze(read_tflite(compiled_model_bytes()))
    assert report.compiled and report.mapped == report.total == 1 and report.on_edgetpu(0)
    assert report.summary().startswith("already compiled for the Edge TPU: 1 Edge TPU custom op(s); 0 of 1")


def test_a_compiled_model_with_a_cpu_tail():
    g = GraphBuilder()
    x, y = g.activation("x", [1, 10], "UINT8"), g.activation("y", [1, 10], "UINT8")
    g.op("CUSTOM", [x], [y], custom_code="edgetpu-custom-op")
    g.operators[-1].customOptions = list(custom_options(package_bytes(14)))
    z = g.activation("z", [1, 10], "FLOAT32", quantized=False)
    g.op("DEQUANTIZE", [y], [z])
    report = analyze(read_tflite(g.build([x], [z])))
    assert report.compiled and report.mapped == 1 and report.total == 2
    assert report.first_unsupported.opcode == "DEQUANTIZE" and not report.on_edgetpu(1)
    assert "1 of 2 ops run on the CPU" in report.summary()


# ---- model requirements -------------------------------------------------------------------------

def test_float_activations():
    assert_refused(unary("ADD", [1, 10], [1, 10], in_type="FLOAT32"), "tensor 'x' is FLOAT32", "int8/uint8")


def test_float_weights():
    g = GraphBuilder()
    x, y = g.activation("x", [1, 4, 4, 2]), g.activation("y", [1, 4, 4, 2])
    w = g.constant("w", np.ones((2, 1, 1, 2)), "FLOAT32")
    b = g.constant("b", np.zeros(2), "INT32")
    g.op("CONV_2D", [x, w, b], [y], **CONV)
    assert_refused(g.build([x], [y]), "constant tensor 'w' is FLOAT32")


def test_unquantized_eight_bit_tensor():
    g = GraphBuilder()
    x, y = g.activation("x", [1, 10]), g.activation("y", [1, 10], quantized=False)
    g.op("RELU", [x], [y])
    assert_refused(g.build([x], [y]), "'y' is INT8 without quantization parameters")


def test_dynamic_shape():
    g = GraphBuilder()
    x = g.activation("x", [1, 10], signature=[1, -1])
    y = g.activation("y", [1, 10], signature=[1, -1])
    g.op("RELU", [x], [y])
    assert_refused(g.build([x], [y]), "dynamic shape [1, -1]", "static shapes")


def test_a_batch_left_open_in_the_signature_is_batch_one():
    """Keras writes [-1, 28, 28] when the batch is not fixed; over a shape of [1, 28, 28] edgetpu_compiler 15 maps
    it (MarcelloCeresini/Franco's model_edgetpu.log: RESHAPE and both FULLY_CONNECTED mapped)."""
    g = GraphBuilder()
    x = g.activation("x", [1, 28, 28], signature=[-1, 28, 28])
    y = g.activation("y", [1, 784], signature=[-1, 784])
    g.op("RESHAPE", [x, g.constant("shape", [1, 784])], [y])
    assert_accepted(g.build([x], [y]))


def test_effective_rank_and_batch():
    assert_accepted(unary("RELU", [1, 28, 28, 8], [1, 28, 28, 8]))
    assert_accepted(unary("RELU", [1, 1, 28, 28, 8], [1, 1, 28, 28, 8]))  # 5-D, but only 3 dims > 1
    assert_refused(unary("RELU", [2, 28, 28, 8], [2, 28, 28, 8]),
                   "shape [2, 28, 28, 8]", "effective rank <= 3", "batch 2")
    assert_refused(unary("RELU", [1, 3, 28, 28, 8], [1, 3, 28, 28, 8]), "only the 3 innermost dimensions")
    assert_refused(unary("RELU", [4, 10], [4, 10]), "model input 'x' has shape [4, 10], batch 4")


# ---- per-operator limits ------------------------------------------------------------------------

@pytest.mark.parametrize("pool", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_pooling_without_fused_activation(pool):
    options = dict(padding=0, strideW=2, strideH=2, filterWidth=2, filterHeight=2)
    assert_accepted(unary(pool, [1, 8, 8, 4], [1, 4, 4, 4], fusedActivationFunction=0, **options))
    assert_refused(unary(pool, [1, 8, 8, 4], [1, 4, 4, 4], fusedActivationFunction=3, **options),
                   "fused RELU6 activation")


@pytest.mark.parametrize("conv", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_convolution_dilation_must_match(conv):
    def graph(w, h):
        g = GraphBuilder()
        x, y = g.activation("x", [1, 8, 8, 4]), g.activation("y", [1, 8, 8, 4])
        weights = g.constant("w", np.ones((4, 3, 3, 4) if conv == "CONV_2D" else (1, 3, 3, 4)), "INT8")
        bias = g.constant("b", np.zeros(4), "INT32")
        g.op(conv, [x, weights, bias], [y], **dict(CONV, dilationWFactor=w, dilationHFactor=h))
        return g.build([x], [y])

    assert_accepted(graph(2, 2))
    assert_refused(graph(2, 1), "dilation 2 in x and 1 in y")


def test_convolution_weights_must_be_constant():
    g = GraphBuilder()
    x, w = g.activation("x", [1, 8, 8, 4]), g.activation("w", [4, 1, 1, 4])
    y = g.activation("y", [1, 8, 8, 4])
    g.op("CONV_2D", [x, w, -1], [y], **CONV)
    assert_refused(g.build([x, w], [y]), "parameter tensor 'w'", "constant at compile time")


def test_fully_connected_output_is_one_dimensional():
    def graph(out_shape, weights_format=0):
        g = GraphBuilder()
        x = g.activation("x", [1, 2, 16])
        w = g.constant("w", np.ones((10, 16)), "INT8")
        y = g.activation("y", out_shape)
        g.op("FULLY_CONNECTED", [x, w, -1], [y], weightsFormat=weights_format, keepNumDims=len(out_shape) == 3)
        return g.build([x], [y])

    assert_accepted(graph([1, 10]))
    assert_refused(graph([1, 2, 10]), "output 'y' has shape [1, 2, 10]", "one-dimensional")
    assert_refused(graph([1, 10], weights_format=1), "SHUFFLED4x16INT8 format")


def test_softmax_over_at_most_16000_innermost_elements():
    assert_accepted(unary("SOFTMAX", [1, MAX_SOFTMAX_ELEMENTS], [1, MAX_SOFTMAX_ELEMENTS], beta=1.0))
    assert_refused(unary("SOFTMAX", [1, 20000], [1, 20000], beta=1.0), "over 20000 elements", "at most 16000")
    # Coral's table says one-dimensional; compiler 16 maps a YOLOv8 DFL's softmax over [1, 4, 756, 16]
    assert_accepted(unary("SOFTMAX", [1, 4, 756, 16], [1, 4, 756, 16], beta=1.0))


def test_strided_slice_strides_of_one():
    def graph(strides, **options):
        return unary("STRIDED_SLICE", [1, 8, 8, 4], [1, 4, 8, 4], extra_inputs=[
            ("begin", [0, 0, 0, 0], "INT32"), ("end", [1, 8, 8, 4], "INT32"), ("strides", strides, "INT32")],
            **options)

    assert_accepted(graph([1, 1, 1, 1]))
    assert_refused(graph([1, 2, 1, 1]), "strides [1, 2, 1, 1]", "all strides equal to 1")
    assert_refused(graph([1, 1, 1, 1], ellipsisMask=1), "ellipsisMask 1")


def test_concatenation_takes_a_constant_only_as_zero_padding():
    def graph(constant_value=None, inputs=2, activation=0):
        g = GraphBuilder()
        xs = [g.activation(f"x{i}", [1, 4, 4, 2]) for i in range(inputs - (constant_value is not None))]
        if constant_value is not None:
            # real = scale * (q - zero_point): q == zero_point is a real zero
            xs.append(g.constant("pad", np.full((1, 4, 4, 2), constant_value), "INT8", zero_point=-3))
        y = g.activation("y", [1, 4, 4, 2 * inputs])
        g.op("CONCATENATION", xs, [y], axis=3, fusedActivationFunction=activation)
        return g.build(xs[:1], [y])

    assert_accepted(graph())
    assert_accepted(graph(constant_value=-3))
    assert_refused(graph(constant_value=5), "constant input 'pad' that is not all zeros")
    assert_refused(graph(constant_value=-3, inputs=3), "CONCATENATION of 3 inputs with a constant one")
    assert_refused(graph(activation=1), "fused RELU activation")


def test_mean_not_over_the_batch_and_z_in_fours():
    def graph(axes, channels=8):
        out = [1 if i in axes else d for i, d in enumerate([1, 6, 6, channels])]
        return unary("MEAN", [1, 6, 6, channels], out, extra_inputs=[("axes", axes, "INT32")], keepDims=True)

    assert_accepted(graph([1, 2]))
    assert_accepted(graph([-1]))  # z-reduction over 8 channels
    assert_refused(graph([3], channels=10), "innermost (z) dimension of size 10", "multiple of 4")
    assert_refused(graph([0, 1]), "including the batch dimension")


def test_sum_not_over_the_batch():
    assert_refused(unary("SUM", [1, 6, 6, 4], [1, 1, 6, 4], extra_inputs=[("axes", [0, 1], "INT32")], keepDims=True),
                   "SUM reduces axes [0, 1]", "batch")


def test_pad_not_in_the_batch():
    def graph(paddings):
        return unary("PAD", [1, 6, 6, 4], [1 + sum(paddings[0]), 8, 8, 4],
                     extra_inputs=[("paddings", paddings, "INT32")])

    assert_accepted(graph([[0, 0], [1, 1], [1, 1], [0, 0]]))
    assert_refused(graph([[1, 0], [1, 1], [1, 1], [0, 0]]), "pads the batch dimension by [1, 0]")


def test_pack_and_split_not_in_the_batch():
    g = GraphBuilder()
    a, b = g.activation("a", [1, 4, 4]), g.activation("b", [1, 4, 4])
    y = g.activation("y", [2, 1, 4, 4])
    g.op("PACK", [a, b], [y], valuesCount=2, axis=0)
    assert_refused(g.build([a, b], [y]), "PACK along axis 0")

    g = GraphBuilder()
    axis = g.constant("axis", np.array(0, np.int32), "INT32", shape=[])
    x = g.activation("x", [2, 4, 4, 4])
    outs = [g.activation(f"y{i}", [1, 4, 4, 4]) for i in range(2)]
    g.op("SPLIT", [axis, x], outs, numSplits=2)
    assert_refused(g.build([x], outs), "SPLIT along axis 0")


def test_squeeze_only_leading_ones():
    assert_accepted(unary("SQUEEZE", [1, 5, 10], [5, 10], squeezeDims=[0]))
    assert_refused(unary("SQUEEZE", [5, 1, 10], [5, 10], squeezeDims=[1]), "removes dimension 1 of shape [5, 1, 10]")


# ---- operator versions (edgetpu_compiler 16.0) ---------------------------------------------------

def test_op_versions_of_the_committed_models_are_reported_honestly():
    from app.edgetpu.compat import op_version_notes

    notes = {(n.opcode, n.version): n.status for n in op_version_notes(read_tflite(
        MODELS / "efficientnet_lite0" / "efficientnet_lite0_int8.tflite"))}
    assert notes[("QUANTIZE", 1)] == "accepted"
    assert notes[("CONV_2D", 3)] == "unknown"  # not documented either way: said, not guessed
    assert "refused" not in notes.values()


def test_a_refused_op_version_refuses_the_whole_model():
    """edgetpu_compiler 16 stops parsing at an operator version it does not register ("Didn't find op for builtin
    opcode 'CONV_2D' version '6'"): nothing compiles. Ultralytics' YOLO11 exports made with a recent TensorFlow
    write CONV_2D version 6."""
    from dataclasses import replace

    from app.edgetpu.compat import COMPILER_16_REFUSED_FROM, op_version_notes

    model = read_tflite(MODELS / "fashion_mnist" / "fashion_mnist_int8.tflite")
    graph = model.graph
    conv = next(op for op in graph.operators if op.opcode == "CONV_2D")
    newer = replace(conv, version=COMPILER_16_REFUSED_FROM["CONV_2D"])
    bumped = replace(model, subgraphs=(replace(graph, operators=tuple(
        newer if op.index == conv.index else op for op in graph.operators)),))
    report = analyze(bumped)
    assert report.first_unsupported.index == conv.index and "version 6" in report.first_unsupported.reason
    assert report.mapped == 0 and not any(report.on_edgetpu(i) for i in range(report.total))
    assert report.summary() == (f"edgetpu_compiler 16 would refuse the whole model (CONV_2D version 6 at index "
                                f"{conv.index}); 0 of {report.total} ops would run on the Edge TPU")
    assert report.placement(0).startswith("edgetpu_compiler 16 refuses the whole model for the version of CONV_2D")
    assert report.status(0) == MODEL_REFUSED and not report.as_intended
    assert ("CONV_2D", 6, "refused") in {(n.opcode, n.version, n.status) for n in op_version_notes(bumped)}


# ---- the host's edges: a detector's post-processing, a float model's QUANTIZE/DEQUANTIZE -------------------

@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
def test_a_detectors_post_processing_runs_on_the_cpu_as_intended(feed):
    from tests.detection_models import tiny_detector

    report = analyze(read_tflite(tiny_detector(feed=feed)))
    tail = 3 if feed == "dequantize" else 1  # DEQUANTIZE x2 feeding the op, or the op alone
    assert report.as_intended and not report.all_mapped
    assert (report.mapped, report.tail, report.total) == (9 - tail, tail, 9)
    assert report.summary().endswith("TFLite_Detection_PostProcess after it, as intended")
    assert "as intended" in report.placement(8) and report.to_dict()["as_intended"] is True


def test_a_compiled_detector_is_its_custom_op_then_the_post_processing():
    """edgetpu_compiler's SSD output: edgetpu-custom-op, then TFLite_Detection_PostProcess on the CPU."""
    report = analyze(read_tflite(compiled_detector_bytes()))
    assert report.compiled and (report.mapped, report.tail, report.total) == (1, 1, 2)
    assert report.as_intended
    assert report.summary() == ("already compiled for the Edge TPU: 1 Edge TPU custom op(s); 1 of 2 ops run on the "
                                "CPU (TFLite_Detection_PostProcess after it, as intended)")


def test_a_float_io_model_maps_between_its_quantize_and_dequantize():
    from tests.classifier_models import tiny_classifier

    report = analyze(read_tflite(tiny_classifier(io="float")))
    assert (report.head, report.mapped, report.tail, report.total) == (1, 5, 1, 7)
    assert report.as_intended and not report.on_edgetpu(0) and report.on_edgetpu(1) and not report.on_edgetpu(6)
    assert "float input's QUANTIZE before it and DEQUANTIZE after it" in report.summary()


def test_a_supported_op_stranded_after_the_post_processing_is_not_as_intended():
    """Only host ops may follow the partition: a DEQUANTIZE in the middle still strands what comes after it."""
    g = GraphBuilder()
    x = g.activation("x", [1, 4, 4, 4], "UINT8", zero_point=128)
    f = g.activation("f", [1, 4, 4, 4], "FLOAT32", quantized=False)
    g.op("DEQUANTIZE", [x], [f])
    y = g.activation("y", [1, 4, 4, 4], "INT8")
    g.op("QUANTIZE", [f], [y])
    report = analyze(read_tflite(g.build([x], [y])))
    assert not report.as_intended and report.mapped == 0 and report.tail == 0
    # neither follows anything of the Edge TPU's: both are CPU ops on their own account
    assert [report.status(i) for i in range(2)] == [UNSUPPORTED_DATA_TYPE, UNSPECIFIED_LIMITATION]


# ---- what edgetpu_compiler's own output shows (app/edgetpu/compiler_limits.py) -------------------------------------

def test_a_branch_that_does_not_depend_on_the_refused_op_still_maps():
    """YOLOv8n at 640 stores its P3 head branch (217-231) after the P4 TRANSPOSE the compiler refuses (215), and
    that branch maps: the compiler follows the data, not the order (nerbivol/edgetpu_lite's log: 230 of 254)."""
    g = GraphBuilder()
    x = g.activation("x", [1, 8, 8, 4])
    a, b, c, d = (g.activation(n, [1, 8, 8, 4]) for n in "abcd")
    e = g.activation("e", [1, 8, 8, 8])
    g.op("ADD", [x, x], [a])
    g.op("HARD_SWISH", [a], [b])
    g.op("ADD", [b, b], [c])  # depends on the refused op
    g.op("ADD", [a, a], [d])  # stored after it, does not depend on it
    g.op("CONCATENATION", [c, d], [e], axis=3)  # joins both
    report = analyze(read_tflite(g.build([x], [e, d])))
    assert [report.on_edgetpu(i) for i in range(5)] == [True, False, False, True, False]
    assert report.mapped == 2 and report.first_unsupported.index == 1
    assert report.table() == Counter({("ADD", MAPPED): 2, ("HARD_SWISH", NOT_AN_EDGETPU_OP): 1,
                                      ("ADD", MORE_THAN_ONE_SUBGRAPH): 1, ("CONCATENATION", MORE_THAN_ONE_SUBGRAPH): 1})
    assert report.placement(4).startswith("depends on HARD_SWISH at index 1")
    assert report.summary() == "first unsupported op: HARD_SWISH at index 1; 2 of 5 ops would run on the Edge TPU"


def transpose(shape, perm) -> bytes:
    return unary("TRANSPOSE", shape, [shape[p] for p in perm], extra_inputs=[("perm", perm, "INT32")])


def test_a_transpose_maps_up_to_a_size():
    """Outside Coral's table, yet compiler 16 maps YOLOv8's [1, 20, 20, 144] TRANSPOSE, and refuses [1, 40, 40, 64]."""
    assert TRANSPOSE_VALUES.mapped_up_to == 20 * 20 * 144 and TRANSPOSE_VALUES.refused_from == 40 * 40 * 64
    nhwc_to_nchw = [0, 3, 1, 2]
    small = verdict_of(transpose([1, 20, 20, 144], nhwc_to_nchw))
    assert small.supported and small.status == MAPPED and small.unsure is None
    assert_refused(transpose([1, 40, 40, 64], nhwc_to_nchw), "the count of values it moves is 102,400",
                   "edgetpu_compiler 16 leaves that on the CPU", "mapped up to 57,600")
    assert verdict_of(transpose([1, 40, 40, 64], nhwc_to_nchw)).status == UNSPECIFIED_LIMITATION
    # YOLOv8n at 192: 82,944 values, between the two: predicted to map, and said to be unsure
    between = verdict_of(transpose([1, 24, 24, 144], nhwc_to_nchw))
    assert between.supported and "82,944" in between.unsure and "predicted to map" in between.unsure


@pytest.mark.parametrize("shape, verdict", [
    ([1, 84, 2100], "maps"),          # YOLOv8n at 320: CONCATENATION to [1, 84, 2100] maps
    ([1, 4, 8400, 16], "maps"),       # the DFL at 640: 134,400 in its two innermost dimensions
    ([1, 100, 2000], "unsure"),       # 200,000: nobody here has seen the compiler decide
    ([1, 144, 1600], "refused"),      # YOLOv8n at 320: RESHAPE to [1, 144, 1600] refused
    ([1, 80, 8400], "refused"),       # YOLOv8n at 640: the classes' LOGISTIC refused
])
def test_a_tensor_large_in_its_two_innermost_dimensions(shape, verdict):
    assert INNER_PLANE.mapped_up_to == 84 * 2100 and INNER_PLANE.refused_from == 144 * 1600
    model = unary("LOGISTIC", shape, shape)
    if verdict == "refused":
        assert_refused(model, f"tensor 'x' {shape}: the count of values in its two innermost dimensions is")
        assert verdict_of(model).status == UNSPECIFIED_LIMITATION
    else:
        result = verdict_of(model)
        assert result.supported and (result.unsure is not None) == (verdict == "unsure"), result.unsure


def test_a_reshape_of_many_values():
    """YOLOv5's Detect head at 640: [1, 40, 40, 255] -> [1, 1600, 3, 85] maps, [1, 80, 80, 255] -> [1, 6400, 3, 85]
    does not (Sandhya1708/modelnew's log: RESHAPE 3 not mapped), though neither is large in its inner dimensions."""
    def reshape(source, result):
        return unary("RESHAPE", source, result, extra_inputs=[("shape", result, "INT32")])

    assert RESHAPE_VALUES.mapped_up_to == 40 * 40 * 255 and RESHAPE_VALUES.refused_from == 80 * 80 * 255
    assert_accepted(reshape([1, 40, 40, 255], [1, 1600, 3, 85]))
    assert_refused(reshape([1, 80, 80, 255], [1, 6400, 3, 85]), "the count of values it moves is 1,632,000")
    assert "918,000" in verdict_of(reshape([1, 60, 60, 255], [1, 3600, 3, 85])).unsure
    # the same level's later RESHAPE to [1, 4800, 85] falls to the innermost dimensions' limit
    assert_refused(reshape([1, 1600, 3, 85], [1, 4800, 85]), "[1, 4800, 85]", "408,000")


def test_a_bilinear_resize_by_its_scale():
    """MoveNet's 2x upsamplings map; DeepLab's 1 x 1 -> 33 x 33 and 33 -> 513 do not (google-coral/test_data)."""
    def resize(source, result):
        return unary("RESIZE_BILINEAR", source, result, extra_inputs=[("size", result[1:3], "INT32")])

    assert BILINEAR_SCALE.mapped_up_to == 2 and BILINEAR_SCALE.refused_from == 513 / 33
    assert_accepted(resize([1, 24, 24, 24], [1, 48, 48, 24]))
    assert_refused(resize([1, 1, 1, 256], [1, 33, 33, 256]), "its scale factor is 33")
    assert_refused(resize([1, 33, 33, 19], [1, 513, 513, 19]), "its scale factor is 15.5455")
    assert "its scale factor is 4" in verdict_of(resize([1, 24, 24, 24], [1, 96, 96, 24])).unsure


def test_tile_maps_though_the_table_leaves_it_out():
    """Coral's slim DeepLab tiles its image pooling [1, 1, 1, 128] to [1, 33, 33, 128], inside the compiled op."""
    model = unary("TILE", [1, 1, 1, 128], [1, 33, 33, 128], extra_inputs=[("multiples", [1, 33, 33, 1], "INT32")])
    result = verdict_of(model)
    assert result.supported and result.unsure is None


def test_a_split_along_the_outermost_axis_of_a_rank_3_tensor():
    """YOLO11's C2PSA attention at 256: SPLIT of [2, 64, 32] into two [1, 64, 32] stays on the CPU with only Edge
    TPU operators before it (mark81681/rasp and freedomwebtech/yolo11-appwrite-rpi4, compiled)."""
    def split(shape, axis):
        g = GraphBuilder()
        x = g.activation("x", shape)
        parts = [g.activation(f"part{i}", [d if a != axis else d // 2 for a, d in enumerate(shape)]) for i in range(2)]
        g.op("SPLIT", [g.constant("axis", [axis], shape=[]), x], parts, numSplits=2)
        return g.build([x], parts)

    assert_refused(split([2, 64, 32], 0), "outermost axis of shape [2, 64, 32]")
    assert_accepted(split([1, 64, 64], 2))


def test_an_operator_no_measured_file_shows_mapped_is_unsure():
    result = verdict_of(unary("TANH", [1, 10], [1, 10]))
    assert result.supported and "Coral's table lists Tanh" in result.unsure and "TANH" in result.unsure
    # only placements that rest on it count: a TANH the CPU runs anyway is not listed
    g = GraphBuilder()
    x, a, h, y = (g.activation(n, [1, 10]) for n in ("x", "a", "h", "y"))
    g.op("ADD", [x, x], [a])
    g.op("HARD_SWISH", [a], [h])
    g.op("TANH", [h], [y])
    report = analyze(read_tflite(g.build([x], [y])))
    assert report.ops[2].unsure and report.unsure == [] and not report.on_edgetpu(2)
    alone = analyze(read_tflite(unary("TANH", [1, 10], [1, 10])))
    assert [v.opcode for v in alone.unsure] == ["TANH"] and alone.to_dict()["unsure"][0]["opcode"] == "TANH"


# ---- advice: what to change where a YOLO export falls off ----------------------------------------------------------

def advice_of(model_bytes: bytes) -> dict:
    return {a.topic: a for a in analyze(read_tflite(model_bytes)).advice}


def test_silu_activations_are_named_with_relu6_as_the_change():
    g = GraphBuilder()
    x = g.activation("x", [1, 8, 8, 4])
    s = g.activation("sigmoid", [1, 8, 8, 4])
    y = g.activation("silu", [1, 8, 8, 4])
    g.op("LOGISTIC", [x], [s])
    g.op("MUL", [s, x], [y])
    advice = advice_of(g.build([x], [y]))
    assert list(advice) == ["SiLU"] and advice["SiLU"].ops == (0, 1)
    assert "ReLU6" in advice["SiLU"].change and "ultralytics/ultralytics#4719" in advice["SiLU"].source
    lone = unary("LOGISTIC", [1, 8], [1, 8])  # a sigmoid alone (class scores) is no SiLU
    assert advice_of(lone) == {}


def test_hard_swish_says_relu6_with_its_cost():
    advice = advice_of(unary("HARD_SWISH", [1, 8, 8, 4], [1, 8, 8, 4]))["HARD_SWISH"]
    assert "ReLU6" in advice.change and "edgetpu#272" in advice.source
    assert "370 ms" in verdict_of(unary("HARD_SWISH", [1, 8, 8, 4], [1, 8, 8, 4])).reason


def test_a_dfl_decode_inside_the_graph_and_a_large_transpose():
    g = GraphBuilder()
    bins = g.activation("bins", [1, 2100, 4, 16])
    probabilities = g.activation("probabilities", [1, 2100, 4, 16])
    g.op("SOFTMAX", [bins], [probabilities], beta=1.0)
    rows = g.activation("rows", [1, 2100, 84])
    out = g.activation("out", [1, 84, 2100])
    g.op("TRANSPOSE", [rows, g.constant("perm", [0, 2, 1])], [out])
    advice = advice_of(g.build([bins, rows], [probabilities, out]))
    assert {"DFL decode", "TRANSPOSE"} <= set(advice)
    assert "[1, 2100, 4, 16]" in advice["DFL decode"].finding and "yolo_dfl" in advice["DFL decode"].change
    assert "[1, 2100, 84] (176,400 values)" in advice["TRANSPOSE"].finding
    assert "maps one of up to 57,600 values and refuses one of 102,400 or more" in advice["TRANSPOSE"].finding
    assert "edgetpu#868" in advice["TRANSPOSE"].source
    assert "maps all of it at 192 x 192" in advice["DFL decode"].finding


def test_a_transpose_the_compiler_is_seen_to_map_gets_no_advice():
    assert "TRANSPOSE" not in advice_of(transpose([1, 20, 20, 144], [0, 3, 1, 2]))


def test_an_attention_block_is_named_with_what_the_compiled_yolo11_files_show():
    """YOLO11's C2PSA multiplies two computed tensors (a FULLY_CONNECTED whose filter is an activation)."""
    g = GraphBuilder()
    q, k = g.activation("q", [1, 64, 32]), g.activation("k", [64, 32])
    scores = g.activation("scores", [64, 64])
    g.op("FULLY_CONNECTED", [q, k], [scores])
    advice = advice_of(g.build([q, k], [scores]))
    assert advice["attention"].ops == (0,) and "SPLIT of [2, 64, N]" in advice["attention"].finding
    assert "mark81681/rasp" in advice["attention"].source


def _yolo_shaped(side: int, values: int = 84) -> bytes:
    """An image input of side x side and a head-shaped output [1, values, N] for strides 8, 16, 32."""
    g = GraphBuilder()
    image = g.activation("image", [1, side, side, 3])
    n = sum((side // s) ** 2 for s in (8, 16, 32))
    out = g.activation("out", [1, values, n])
    g.op("RESHAPE", [image, g.constant("shape", [1, values, n])], [out])
    return g.build([image], [out])


def test_the_input_size_of_a_yolo_head():
    assert "input size" not in advice_of(_yolo_shaped(320))
    large = advice_of(_yolo_shaped(640))["input size"]
    assert "4x those at 320x320" in large.finding and "export at 320x320" in large.change
    odd = advice_of(_yolo_shaped(300))["input size"]
    assert "300x300, not a multiple of 32" in odd.finding
    assert "input size" not in advice_of(conv_chain())  # not a YOLO head: no opinion on its size


def test_the_object_detection_apis_pack_upsampling_and_several_subgraphs():
    from ai_edge_litert import schema_py_generated as schema
    import flatbuffers

    g = GraphBuilder()
    x = g.activation("x", [1, 4, 4, 8])
    stacked = g.activation("stacked", [1, 4, 4, 2, 8])
    g.op("PACK", [x, x], [stacked], valuesCount=2, axis=3)
    data = g.build([x], [stacked])
    advice = advice_of(data)["PACK upsampling"]
    assert advice.ops == (0,) and "use_native_resize_op" in advice.change
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    model.subgraphs.append(model.subgraphs[0])
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    two = advice_of(bytes(builder.Output()))["subgraphs"]
    assert "2 subgraphs" in two.finding and "nms=False" in two.change


def test_clean_models_get_no_advice_and_the_advice_is_in_the_json():
    assert analyze_file(MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite").advice == ()
    report = analyze(read_tflite(unary("HARD_SWISH", [1, 8, 8, 4], [1, 8, 8, 4])))
    assert json.loads(report.to_json())["advice"][0]["topic"] == "HARD_SWISH"
    from app.edgetpu.compiler_view import compiler_view

    assert compiler_view(report)["advice"][0]["change"].startswith("use ReLU6")
