"""FULLY_CONNECTED and BATCH_MATMUL against BUILTIN_REF, on randomized models.

FULLY_CONNECTED with a constant filter (int8 per tensor with any zero point, or per channel, whose zero points
the kernel does not read; uint8), with a filter the graph computes (as YOLO11's attention has it), and in float32;
BATCH_MATMUL with int8 operands (to int8 and to int32) and float32 ones, ranks 2 to 5 with broadcast batch
dimensions, adj_x and adj_y, constant or computed operands. What the emulator refuses, it refuses with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.emulator import Interpreter
from app.emulator.errors import UnsupportedOperators
from tests.emulator_cases import (
    OP_SETTINGS,
    activations,
    assert_matches_reference,
    case,
    quantization,
    random_values,
    reference,  # noqa: F401 (fixture)
    run_emulator,
    seeds,
    values_of,
)
from tests.reference_worker import Refused
from tests.tflite_builder import GraphBuilder


def _output_scale(draw, input_scale: float, filter_scales, depth: int) -> float:
    """An output scale that keeps results spread over the 8-bit range (not all clamped, not all zero)."""
    typical = input_scale * float(np.mean(filter_scales)) * 64 * np.sqrt(depth) * 2
    return float(np.float32(typical * 2.0 ** draw(st.floats(-3, 3))))


def _scales(draw, count: int, low: float = 1e-3, high: float = 0.05) -> list[float]:
    return [float(np.float32(np.exp(draw(st.floats(np.log(low), np.log(high)))))) for _ in range(count)]


@st.composite
def filter_quantization(draw, type_name: str, units: int):
    """uint8: per tensor, any zero point. int8: per tensor with any zero point (the kernel applies it), or per
    channel, its zero points 0 or not (the per-channel kernel does not read them)."""
    per_channel = type_name == "INT8" and draw(st.booleans())
    scales = _scales(draw, units if per_channel else 1)
    info = np.iinfo(np.int8 if type_name == "INT8" else np.uint8)
    if per_channel and draw(st.booleans()):
        return scales, [0] * units
    zero_point = draw(st.integers(int(info.min), int(info.max)))
    return scales, [zero_point] * len(scales)


def _bias(g: GraphBuilder, seed: int, input_scale: float, filter_scales, units: int) -> int:
    scales = [float(np.float32(np.float64(np.float32(input_scale)) * s)) for s in filter_scales]
    values = np.random.default_rng(seed + 1).integers(-(2**15), 2**15, units)
    return g.tensor("bias", (units,), "INT32", scale=scales if len(scales) > 1 else scales[0],
                    zero_point=[0] * len(scales), axis=0, data=values)


def _fully_connected_shapes(draw, depth: int, units: int):
    """Input and output shapes: 2-D, or keep_num_dims over a rank-3 input, or a rank-3 input flattened."""
    batch = draw(st.integers(1, 3))
    form = draw(st.sampled_from(["flat", "keep", "flatten"]))
    if form == "keep":
        return (1, batch, depth), (1, batch, units), True
    if form == "flatten":
        return (batch, 1, depth), (batch, units), False
    return (batch, depth), (batch, units), False


@st.composite
def fully_connected_models(draw, computed_filter: bool = False):
    """A constant filter (a bias or none), or a filter the graph computes, fed as an input (no bias), as an
    attention's softmax or keys are: asymmetric, any zero points, at times a softmax's own (1/256, lowest)."""
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    depth, units = draw(st.integers(1, 300)), draw(st.integers(1, 40))
    input_shape, output_shape, keep_num_dims = _fully_connected_shapes(draw, depth, units)
    s_in, z_in = draw(quantization(type_name))
    filter_scales, filter_zero_points = draw(filter_quantization(type_name, units))
    if computed_filter and draw(st.booleans()):
        filter_scales, filter_zero_points = [1 / 256], [-128 if type_name == "INT8" else 0]
    s_out = _output_scale(draw, s_in, filter_scales, depth)
    z_out = draw(quantization(type_name))[1]
    with_bias = not computed_filter and draw(st.booleans())
    seed = draw(seeds)
    weights = random_values(seed, (units, depth), type_name)
    g = GraphBuilder()
    x = g.tensor("input", input_shape, type_name, scale=s_in, zero_point=z_in)
    w = g.tensor("filter", (units, depth), type_name, scale=filter_scales, zero_point=filter_zero_points, axis=0,
                 data=None if computed_filter else weights)
    b = _bias(g, seed, s_in, filter_scales, units) if with_bias else -1
    y = g.tensor("output", output_shape, type_name, scale=s_out, zero_point=z_out)
    activation = draw(activations)
    g.op("FULLY_CONNECTED", [x, w, b], [y], "FullyConnectedOptions", keepNumDims=keep_num_dims,
         fusedActivationFunction=activation)
    values = {x: random_values(seed + 2, input_shape, type_name), w: weights}
    order = draw(st.sampled_from([(x, w), (w, x)])) if computed_filter else (x,)  # the graph's inputs, any order
    return case(g.build(list(order), [y]), [values[t] for t in order], type=type_name, input=input_shape,
                units=units, computed_filter=computed_filter, bias=with_bias, activation=activation,
                input_q=(s_in, z_in), filter_q=(filter_scales, filter_zero_points), output_q=(s_out, z_out), seed=seed)


@st.composite
def fully_connected_float_models(draw):
    """float32, the weights constant or computed, the bias absent, constant or computed; special values at times."""
    depth, units = draw(st.integers(1, 40)), draw(st.integers(1, 20))
    input_shape, output_shape, keep_num_dims = _fully_connected_shapes(draw, depth, units)
    special, seed = draw(st.booleans()), draw(seeds)
    weights_kind = draw(st.sampled_from(["constant", "computed"]))
    bias_kind = draw(st.sampled_from(["none", "constant", "computed"]))
    g = GraphBuilder()
    inputs, values = [], []
    x = g.tensor("input", input_shape, "FLOAT32")
    inputs.append(x)
    values.append(values_of(seed, input_shape, "FLOAT32", special))
    weights = values_of(seed + 1, (units, depth), "FLOAT32", special)
    w = g.tensor("weights", (units, depth), "FLOAT32", data=weights if weights_kind == "constant" else None)
    if weights_kind == "computed":
        inputs.append(w)
        values.append(weights)
    b = -1
    if bias_kind != "none":
        bias = values_of(seed + 2, (units,), "FLOAT32", special)
        b = g.tensor("bias", (units,), "FLOAT32", data=bias if bias_kind == "constant" else None)
        if bias_kind == "computed":
            inputs.append(b)
            values.append(bias)
    y = g.tensor("output", output_shape, "FLOAT32")
    activation = draw(activations)
    g.op("FULLY_CONNECTED", [x, w, b], [y], "FullyConnectedOptions", keepNumDims=keep_num_dims,
         fusedActivationFunction=activation)
    return case(g.build(inputs, [y]), values, input=input_shape, units=units, weights=weights_kind, bias=bias_kind,
                activation=activation, special=special, seed=seed)


@st.composite
def batch_shapes(draw):
    """LHS and RHS shapes (ranks 2 to 5) whose batch dimensions broadcast, with adj_x and adj_y."""
    lhs_rank, rhs_rank = draw(st.integers(2, 5)), draw(st.integers(2, 5))
    batch = [draw(st.integers(1, 3)) for _ in range(max(lhs_rank, rhs_rank) - 2)]
    lhs_batch = [d if draw(st.booleans()) else 1 for d in batch[len(batch) - (lhs_rank - 2):]]
    rhs_batch = [d if draw(st.booleans()) else 1 for d in batch[len(batch) - (rhs_rank - 2):]]
    rows, depth, columns = draw(st.integers(1, 12)), draw(st.integers(1, 40)), draw(st.integers(1, 12))
    adj_x, adj_y = draw(st.booleans()), draw(st.booleans())
    lhs = (*lhs_batch, *((depth, rows) if adj_x else (rows, depth)))
    rhs = (*rhs_batch, *((columns, depth) if adj_y else (depth, columns)))
    out_batch = np.broadcast_shapes(tuple(lhs_batch), tuple(rhs_batch))
    return lhs, rhs, (*out_batch, rows, columns), depth, adj_x, adj_y


def _operand(g: GraphBuilder, name: str, shape, type_name: str, constant: bool, value: np.ndarray, **quantized) -> int:
    return g.tensor(name, shape, type_name, data=value if constant else None, **quantized)


@st.composite
def batch_matmul_models(draw):
    lhs_shape, rhs_shape, output_shape, depth, adj_x, adj_y = draw(batch_shapes())
    s_lhs, z_lhs = draw(quantization("INT8"))
    s_rhs, z_rhs = draw(quantization("INT8"))
    s_out = _output_scale(draw, s_lhs, [s_rhs], depth)
    z_out = draw(quantization("INT8"))[1]
    constant = draw(st.sampled_from(["none", "lhs", "rhs"]))
    seed = draw(seeds)
    values = [random_values(seed, lhs_shape, "INT8"), random_values(seed + 1, rhs_shape, "INT8")]
    g = GraphBuilder()
    lhs = _operand(g, "lhs", lhs_shape, "INT8", constant == "lhs", values[0], scale=s_lhs, zero_point=z_lhs)
    rhs = _operand(g, "rhs", rhs_shape, "INT8", constant == "rhs", values[1], scale=s_rhs, zero_point=z_rhs)
    y = g.tensor("output", output_shape, "INT8", scale=s_out, zero_point=z_out)
    g.op("BATCH_MATMUL", [lhs, rhs], [y], "BatchMatMulOptions", adjX=adj_x, adjY=adj_y)
    fed = [(t, v) for t, v, c in ((lhs, values[0], "lhs"), (rhs, values[1], "rhs")) if c != constant]
    return case(g.build([t for t, _ in fed], [y]), [v for _, v in fed], lhs=lhs_shape, rhs=rhs_shape, adj_x=adj_x,
                adj_y=adj_y, constant=constant, lhs_q=(s_lhs, z_lhs), rhs_q=(s_rhs, z_rhs), output_q=(s_out, z_out),
                seed=seed)


@st.composite
def batch_matmul_plain_models(draw):
    """int8 operands to an int32 output (raw products), or float32 operands, special values at times."""
    lhs_shape, rhs_shape, output_shape, depth, adj_x, adj_y = draw(batch_shapes())
    kind = draw(st.sampled_from(["int32", "float32"]))
    special, seed = draw(st.booleans()), draw(seeds)
    g = GraphBuilder()
    if kind == "int32":
        values = [random_values(seed, lhs_shape, "INT8"), random_values(seed + 1, rhs_shape, "INT8")]
        lhs = g.tensor("lhs", lhs_shape, "INT8", scale=0.1, zero_point=3)
        rhs = g.tensor("rhs", rhs_shape, "INT8", scale=0.2, zero_point=-7)
        y = g.tensor("output", output_shape, "INT32")
    else:
        values = [values_of(seed, lhs_shape, "FLOAT32", special), values_of(seed + 1, rhs_shape, "FLOAT32", special)]
        lhs, rhs = g.tensor("lhs", lhs_shape, "FLOAT32"), g.tensor("rhs", rhs_shape, "FLOAT32")
        y = g.tensor("output", output_shape, "FLOAT32")
    g.op("BATCH_MATMUL", [lhs, rhs], [y], "BatchMatMulOptions", adjX=adj_x, adjY=adj_y)
    return case(g.build([lhs, rhs], [y]), values, kind=kind, lhs=lhs_shape, rhs=rhs_shape, adj_x=adj_x, adj_y=adj_y,
                special=special, seed=seed)


@OP_SETTINGS
@given(fully_connected_models())
def test_fully_connected(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(fully_connected_models(computed_filter=True))
def test_fully_connected_with_a_computed_filter(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(fully_connected_float_models())
def test_fully_connected_float(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(batch_matmul_models())
def test_batch_matmul(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(batch_matmul_plain_models())
def test_batch_matmul_int32_and_float(reference, example):
    assert_matches_reference(reference, example)


def test_large_depth_takes_the_float64_path(reference):
    """A filter sum over 2^24 / 255 forces float64 products; the result is still exact."""
    depth, units = 4096, 3
    g = GraphBuilder()
    x = g.tensor("input", (1, depth), "UINT8", scale=0.02, zero_point=0)
    weights = np.full((units, depth), 255, np.uint8)
    weights[1] = 0
    weights[2, ::2] = 0
    w = g.tensor("filter", (units, depth), "UINT8", scale=0.004, zero_point=0, data=weights)
    y = g.tensor("output", (1, units), "UINT8", scale=1000.0, zero_point=0)
    g.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    model = g.build([x], [y])
    assert Interpreter(model_content=model).plan.steps[0].details["accumulate"] == "float64"
    assert_matches_reference(reference, model, [np.full((1, depth), 255, np.uint8)])
    assert_matches_reference(reference, model, [random_values(7, (1, depth), "UINT8")])


def _attention_product(depth: int, values_zero_point: int) -> bytes:
    """The attention's second product at YOLO11n's 640 size (400 cells): values [64, N] times a softmax [N, N]
    (scale 1/256, zero point -128: its values 0..255 above the zero point)."""
    g = GraphBuilder()
    values = g.tensor("v", (64, depth), "INT8", scale=0.03, zero_point=values_zero_point)
    weights = g.tensor("softmax", (depth, depth), "INT8", scale=1 / 256, zero_point=-128)
    y = g.tensor("out", (64, depth), "INT8", scale=0.016, zero_point=7)
    g.op("FULLY_CONNECTED", [values, weights, -1], [y], "FullyConnectedOptions")
    return g.build([values, weights], [y])


def test_the_exact_float_type_follows_the_zero_points(reference):
    """|acc| <= depth * max|x - zx| * max|w - zw|: at 400 cells, values of zero point -2 (129 at most away from it)
    keep float32 (400 * 129 * 255 < 2^24); values of zero point 127 (255 away) need float64."""
    inputs = [random_values(1, (64, 400), "INT8"), random_values(2, (400, 400), "INT8")]
    for zero_point, accumulate in ((-2, "float32"), (127, "float64")):
        model = _attention_product(400, zero_point)
        assert Interpreter(model_content=model).plan.steps[0].details["accumulate"] == accumulate
        assert_matches_reference(reference, model, inputs)


def test_a_negative_half_rounds_away_from_zero(reference):
    """The reference FULLY_CONNECTED's requantization in double: 3 * -1 * 0.5 = -1.5 gives -2 (fixed point: -1)."""
    g = GraphBuilder()
    x = g.tensor("x", (1, 4), "INT8", scale=0.5, zero_point=0)
    w = g.tensor("w", (3, 4), "INT8", scale=0.5, zero_point=0, data=[[1, 0, 0, 0], [-1, 0, 0, 0], [3, 0, 0, 0]])
    y = g.tensor("y", (1, 3), "INT8", scale=0.5, zero_point=0)
    g.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    model, inputs = g.build([x], [y]), [np.array([[3, 0, 0, 0]], np.int8)]
    assert run_emulator(model, inputs)[0].tolist() == [[2, -2, 5]]
    assert_matches_reference(reference, model, inputs)


def _refusal(model: bytes) -> str:
    with pytest.raises(UnsupportedOperators) as refused:
        Interpreter(model_content=model)
    return str(refused.value)


def test_a_hybrid_model_is_refused_with_the_file_to_import_instead():
    g = GraphBuilder()
    x = g.tensor("x", (1, 8), "FLOAT32")
    w = g.tensor("w", (4, 8), "INT8", scale=0.1, zero_point=0, data=np.ones((4, 8)))
    y = g.tensor("y", (1, 4), "FLOAT32")
    g.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions")
    message = _refusal(g.build([x], [y]))
    assert "hybrid (dynamic-range)" in message and "_full_integer_quant.tflite" in message
    g = GraphBuilder()
    x = g.tensor("x", (1, 2, 8), "FLOAT32")
    w = g.tensor("w", (1, 8, 4), "INT8", scale=0.1, zero_point=0, data=np.ones((1, 8, 4)))
    y = g.tensor("y", (1, 2, 4), "FLOAT32")
    g.op("BATCH_MATMUL", [x, w], [y], "BatchMatMulOptions")
    assert "hybrid (dynamic-range)" in _refusal(g.build([x], [y]))


def test_what_tflite_refuses_is_refused_with_its_reason(reference):
    """uint8 operands (TFLite's BATCH_MATMUL takes float32, int8 and int16) and batch dimensions that do not
    broadcast: both runtimes refuse, the emulator at load with the reason."""
    g = GraphBuilder()
    x = g.tensor("x", (2, 3), "UINT8", scale=0.1, zero_point=3)
    w = g.tensor("w", (3, 4), "UINT8", scale=0.1, zero_point=3)
    y = g.tensor("y", (2, 4), "UINT8", scale=0.5, zero_point=0)
    g.op("BATCH_MATMUL", [x, w], [y], "BatchMatMulOptions")
    model = g.build([x, w], [y])
    assert "UINT8" in _refusal(model)
    assert isinstance(reference.run(model, [np.zeros((2, 3), np.uint8), np.zeros((3, 4), np.uint8)]), Refused)
    g = GraphBuilder()
    x = g.tensor("x", (2, 2, 3), "FLOAT32")
    w = g.tensor("w", (3, 3, 4), "FLOAT32")
    y = g.tensor("y", (3, 2, 4), "FLOAT32")
    g.op("BATCH_MATMUL", [x, w], [y], "BatchMatMulOptions")
    model = g.build([x, w], [y])
    assert "do not broadcast" in _refusal(model)
    assert isinstance(reference.run(model, [np.zeros((2, 2, 3), np.float32), np.zeros((3, 3, 4), np.float32)]),
                      Refused)


def test_an_output_declared_unlike_tflites_shape_is_refused():
    g = GraphBuilder()
    x = g.tensor("x", (2, 3), "INT8", scale=0.1, zero_point=3)
    w = g.tensor("w", (3, 4), "INT8", scale=0.1, zero_point=3)
    y = g.tensor("y", (4, 2), "INT8", scale=0.5, zero_point=0)
    g.op("BATCH_MATMUL", [x, w], [y], "BatchMatMulOptions")
    assert "TFLite's Prepare gives [2, 4]" in _refusal(g.build([x, w], [y]))
