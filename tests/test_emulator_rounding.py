"""Which rounding each kernel of the pinned runtime uses: the evidence, kept as tests.

MultiplyByQuantizedMultiplier rounds once (TFLITE_SINGLE_ROUNDING builds) or twice (gemmlowp's
SaturatingRoundingDoublingHighMul then RoundingDivideByPOT); the two differ by one on a few
values. A third mode needs no multiplier: round(double(acc) * effective_output_scale), half away from
zero (IN_DOUBLE). For each kernel and each mode other than the one the emulator names, a model is
searched (fixed seeds) on which the two give different outputs, and BUILTIN_REF must then agree
with the named mode, and disagree with the other. Measured result: FULLY_CONNECTED requantizes in
double (LiteRT's reference kernel since April 2025; the scales chosen as powers of two make its
negative ties show: -1.5 gives -2, where both fixed-point modes give -1); CONV_2D,
DEPTHWISE_CONV_2D, TRANSPOSE_CONV, BATCH_MATMUL, MUL, QUANTIZE, RELU and MEAN round twice. ADD (and SUB, its twin) cannot
tell them apart: its inputs are shifted left by 20 bits before rescaling, so the output
rescale shifts right by about 20 bits and a tie after the first rounding needs odds of about
2^-21 per value; on every pair of int8 values, for all the scales tried, both modes agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.emulator.fixedpoint import Rounding
from app.emulator.kernels import activations, conv, elementwise, matmul, quantize, reduce
from tests.emulator_cases import random_values, reference, run_emulator  # noqa: F401 (fixture)
from tests.reference_worker import Aborted, Refused
from tests.tflite_builder import GraphBuilder

SEARCH = 25  # models tried per kernel before giving up on finding one where the modes differ


def _other(mode: Rounding) -> Rounding:
    return Rounding.SINGLE_ROUNDING if mode is Rounding.DOUBLE_ROUNDING else Rounding.DOUBLE_ROUNDING


def _fully_connected(rng):
    """Power-of-two scales (a multiplier of 2^-1 to 2^-4): many results fall on exact halves, where the modes part."""
    k, n = 48, 256
    s_in, s_w = 2.0 ** -int(rng.integers(3, 6)), 2.0 ** -int(rng.integers(5, 8))
    s_out = s_in * s_w * 2.0 ** int(rng.integers(1, 5))
    g = GraphBuilder()
    x = g.tensor("x", (1, k), "INT8", scale=s_in, zero_point=3)
    w = g.tensor("w", (n, k), "INT8", scale=s_w, zero_point=int(rng.integers(-5, 5)),
                 data=np.maximum(random_values(1, (n, k), "INT8"), -127) // 16)
    b = g.tensor("b", (n,), "INT32", scale=s_in * s_w, zero_point=0, data=rng.integers(-3000, 3000, n))
    y = g.tensor("y", (1, n), "INT8", scale=s_out, zero_point=-5)
    g.op("FULLY_CONNECTED", [x, w, b], [y], "FullyConnectedOptions")
    return g.build([x], [y]), [random_values(int(rng.integers(1 << 30)), (1, k), "INT8") // 8]


def _batch_matmul(rng):
    """Two computed int8 operands, as in an attention block; random scales."""
    s = [float(np.float32(v)) for v in rng.uniform(0.01, 0.1, 2)]
    g = GraphBuilder()
    x = g.tensor("x", (2, 16, 24), "INT8", scale=s[0], zero_point=int(rng.integers(-20, 20)))
    w = g.tensor("w", (2, 24, 32), "INT8", scale=s[1], zero_point=int(rng.integers(-20, 20)))
    y = g.tensor("y", (2, 16, 32), "INT8", scale=float(np.float32(s[0] * s[1] * 64 * 5 * 2)), zero_point=7)
    g.op("BATCH_MATMUL", [x, w], [y], "BatchMatMulOptions")
    seed = int(rng.integers(1 << 30))
    return g.build([x, w], [y]), [random_values(seed, (2, 16, 24), "INT8"), random_values(seed + 1, (2, 24, 32), "INT8")]


def _conv(rng, opcode: str):
    c_in, c_out = 8, 16
    s_in = float(np.float32(rng.uniform(0.005, 0.05)))
    s_w = rng.uniform(0.001, 0.01, c_out).astype(np.float32)
    g = GraphBuilder()
    x = g.tensor("x", (1, 8, 8, c_in), "INT8", scale=s_in, zero_point=-7)
    if opcode == "CONV_2D":
        shape, axis, options = (c_out, 3, 3, c_in), 0, {"options": "Conv2DOptions"}
        s_out = float(np.float32(s_in * s_w.mean() * 64 * 8))
    else:
        c_out = c_in * 2
        s_w = s_w[:c_out]
        shape, axis, options = (1, 3, 3, c_out), 3, {"options": "DepthwiseConv2DOptions", "depthMultiplier": 2}
        s_out = float(np.float32(s_in * s_w.mean() * 64 * 3))
    w = g.tensor("w", shape, "INT8", scale=s_w, zero_point=[0] * c_out, axis=axis,
                 data=np.maximum(random_values(2, shape, "INT8"), -127))
    b = g.tensor("b", (c_out,), "INT32", scale=(np.float32(s_in) * s_w).astype(np.float32), zero_point=[0] * c_out,
                 data=rng.integers(-3000, 3000, c_out))
    y = g.tensor("y", (1, 8, 8, c_out), "INT8", scale=s_out, zero_point=4)
    name = options.pop("options")
    g.op(opcode, [x, w, b], [y], name, padding="SAME", strideH=1, strideW=1, **options)
    return g.build([x], [y]), [random_values(int(rng.integers(1 << 30)), (1, 8, 8, c_in), "INT8")]


def _transpose_conv(rng):
    c_in, c_out = 8, 16
    s_in = float(np.float32(rng.uniform(0.005, 0.05)))
    s_w = rng.uniform(0.001, 0.01, c_out).astype(np.float32)
    g = GraphBuilder()
    shape = g.constant("output_shape", [1, 16, 16, c_out])
    w = g.tensor("w", (c_out, 3, 3, c_in), "INT8", scale=s_w, zero_point=[0] * c_out,
                 data=np.maximum(random_values(2, (c_out, 3, 3, c_in), "INT8"), -127))
    x = g.tensor("x", (1, 8, 8, c_in), "INT8", scale=s_in, zero_point=-7)
    b = g.tensor("b", (c_out,), "INT32", scale=(np.float32(s_in) * s_w).astype(np.float32), zero_point=[0] * c_out,
                 data=rng.integers(-3000, 3000, c_out))
    y = g.tensor("y", (1, 16, 16, c_out), "INT8", scale=float(np.float32(s_in * s_w.mean() * 64 * 4)), zero_point=4)
    g.op("TRANSPOSE_CONV", [shape, w, x, b], [y], "TransposeConvOptions", version=4, padding="SAME", strideH=2,
         strideW=2)
    return g.build([x], [y]), [random_values(int(rng.integers(1 << 30)), (1, 8, 8, c_in), "INT8")]


def _all_pairs(rng, opcode: str):
    """Every pair of int8 values: x1 is a column, x2 a row, the output their broadcast."""
    q = [(float(np.float32(rng.uniform(0.01, 0.2))), int(rng.integers(-20, 20))) for _ in range(3)]
    g = GraphBuilder()
    x1 = g.tensor("x1", (256, 1), "INT8", scale=q[0][0], zero_point=q[0][1])
    x2 = g.tensor("x2", (1, 256), "INT8", scale=q[1][0], zero_point=q[1][1])
    y = g.tensor("y", (256, 256), "INT8", scale=q[2][0] * (4 if opcode == "MUL" else 1), zero_point=q[2][1])
    g.op(opcode, [x1, x2], [y], {"ADD": "AddOptions", "MUL": "MulOptions"}[opcode])
    values = np.arange(-128, 128, dtype=np.int8)
    return g.build([x1, x2], [y]), [values.reshape(256, 1), values.reshape(1, 256)]


def _all_bytes(rng, opcode: str):
    s_in, s_out = (float(np.float32(v)) for v in rng.uniform(0.01, 0.2, 2))
    g = GraphBuilder()
    x = g.tensor("x", (1, 256), "INT8", scale=s_in, zero_point=int(rng.integers(-20, 20)))
    y = g.tensor("y", (1, 256), "INT8", scale=s_out, zero_point=int(rng.integers(-20, 20)))
    g.op(opcode, [x], [y])
    return g.build([x], [y]), [np.arange(-128, 128, dtype=np.int8).reshape(1, 256)]


def _mean(rng):
    g = GraphBuilder()
    x = g.tensor("x", (2, 7, 7, 32), "INT8", scale=float(np.float32(rng.uniform(0.01, 0.1))), zero_point=-128)
    axis = g.constant("axis", np.array([1, 2], np.int32))
    y = g.tensor("y", (2, 32), "INT8", scale=float(np.float32(rng.uniform(0.01, 0.1))), zero_point=-100)
    g.op("MEAN", [x, axis], [y], "ReducerOptions", keepDims=False)
    return g.build([x], [y]), [random_values(int(rng.integers(1 << 30)), (2, 7, 7, 32), "INT8")]


KERNELS = {
    # kernel: (module, constant, model maker)
    "FULLY_CONNECTED": (matmul, "FULLY_CONNECTED_ROUNDING", _fully_connected),
    "BATCH_MATMUL": (matmul, "BATCH_MATMUL_ROUNDING", _batch_matmul),
    "CONV_2D": (conv, "CONV_ROUNDING", lambda rng: _conv(rng, "CONV_2D")),
    "DEPTHWISE_CONV_2D": (conv, "CONV_ROUNDING", lambda rng: _conv(rng, "DEPTHWISE_CONV_2D")),
    "TRANSPOSE_CONV": (conv, "TRANSPOSE_CONV_ROUNDING", _transpose_conv),
    "ADD": (elementwise, "ADD_ROUNDING", lambda rng: _all_pairs(rng, "ADD")),
    "MUL": (elementwise, "MUL_ROUNDING", lambda rng: _all_pairs(rng, "MUL")),
    "QUANTIZE": (quantize, "REQUANTIZE_ROUNDING", lambda rng: _all_bytes(rng, "QUANTIZE")),
    "RELU": (activations, "RELU_ROUNDING", lambda rng: _all_bytes(rng, "RELU")),
    "MEAN": (reduce, "MEAN_ROUNDING", _mean),
}
MEASURED = {"FULLY_CONNECTED": Rounding.IN_DOUBLE} | {
    name: Rounding.DOUBLE_ROUNDING for name in KERNELS if name != "FULLY_CONNECTED"}
# The modes each kernel can be run in: IN_DOUBLE needs the effective scale, which only the matrix products keep.
MODES = {name: (list(Rounding) if name in ("FULLY_CONNECTED", "BATCH_MATMUL")
                else [Rounding.SINGLE_ROUNDING, Rounding.DOUBLE_ROUNDING]) for name in KERNELS}


INDISTINGUISHABLE = {"ADD"}


@pytest.mark.parametrize("kernel, other", [(kernel, mode) for kernel in sorted(set(KERNELS) - INDISTINGUISHABLE)
                                           for mode in MODES[kernel] if mode is not MEASURED[kernel]],
                         ids=lambda value: value.value if isinstance(value, Rounding) else value)
def test_the_reference_rounds_as_the_emulator_says(reference, monkeypatch, kernel, other):
    module, constant, make = KERNELS[kernel]
    named = getattr(module, constant)
    assert named is MEASURED[kernel]
    rng = np.random.default_rng(20240)
    for _ in range(SEARCH):
        model, inputs = make(rng)
        ours = run_emulator(model, inputs)[0]
        with monkeypatch.context() as patched:
            patched.setattr(module, constant, other)
            theirs = run_emulator(model, inputs)[0]
        if np.array_equal(ours, theirs):
            continue  # this model does not tell the two modes apart; try another
        expected = reference.run(model, inputs)
        assert not isinstance(expected, (Aborted, Refused)), expected
        differing = int(np.count_nonzero(ours != theirs))
        assert np.array_equal(expected[0], ours), f"{kernel}: BUILTIN_REF disagrees with {named.value} rounding"
        assert not np.array_equal(expected[0], theirs)
        assert differing > 0
        return
    pytest.fail(f"{kernel}: no model among {SEARCH} where {named.value} and {other.value} rounding differ")


def test_add_gives_the_same_result_with_either_rounding(reference, monkeypatch):
    """So its named mode is a choice, not a measurement; both modes equal BUILTIN_REF on all pairs."""
    rng = np.random.default_rng(20240)
    for _ in range(SEARCH):
        model, inputs = _all_pairs(rng, "ADD")
        ours = run_emulator(model, inputs)[0]
        with monkeypatch.context() as patched:
            patched.setattr(elementwise, "ADD_ROUNDING", _other(elementwise.ADD_ROUNDING))
            theirs = run_emulator(model, inputs)[0]
        assert np.array_equal(ours, theirs)
        assert np.array_equal(reference.run(model, inputs)[0], ours)
