"""MEAN and SUM against BUILTIN_REF, through each of TFLite's kernels for them; ARG_MAX and ARG_MIN on every input
type, int32 and int64 outputs, any axis, with ties and NaN."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    every_byte,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
    shapes,
    values_of,
)
from tests.tflite_builder import GraphBuilder


@st.composite
def reduce_models(draw, opcode: str):
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    kind = draw(st.sampled_from(["spatial_keep_dims", "any_axes"]))
    if kind == "spatial_keep_dims":  # the 4-D kernel (global average pooling in a converted model)
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 8)))
        axes = draw(st.sampled_from([[1, 2], [2, 1]]))
        keep_dims = True
    else:
        shape = draw(shapes(max_side=8))
        rank = len(shape)
        axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank))
        keep_dims = draw(st.booleans())
    resolved = sorted({a % len(shape) for a in axes})
    output_shape = tuple(1 if i in resolved else d for i, d in enumerate(shape) if keep_dims or i not in resolved)
    input_q = draw(quantization(type_name, 1e-3, 0.5))
    output_q = input_q if draw(st.booleans()) else draw(quantization(type_name, 1e-3, 0.5))
    if opcode == "SUM" and output_q != input_q:
        count = int(np.prod([shape[a] for a in resolved]))
        output_q = (float(np.float32(output_q[0] * count)), output_q[1])  # keep sums mostly in range
    seed = draw(seeds)
    g = GraphBuilder()
    x = g.tensor("input", shape, type_name, scale=input_q[0], zero_point=input_q[1])
    axis = g.constant("axis", np.asarray(axes, np.int32))
    y = g.tensor("output", output_shape, type_name, scale=output_q[0], zero_point=output_q[1])
    g.op(opcode, [x, axis], [y], "ReducerOptions", version=2, keepDims=keep_dims)
    return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], type=type_name, shape=shape, axes=axes,
                keep_dims=keep_dims, input_q=input_q, output_q=output_q, seed=seed)


@OP_SETTINGS
@given(reduce_models("MEAN"))
def test_mean(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(reduce_models("SUM"))
def test_sum(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def arg_min_max_models(draw):
    """Every input type the kernel takes; ties made likely (few distinct values), NaN and -0.0 among floats,
    last-axis rows (the vector kernel) and other axes (the reference loop)."""
    opcode = draw(st.sampled_from(["ARG_MAX", "ARG_MIN"]))
    type_name = draw(st.sampled_from(["INT8", "UINT8", "INT32", "FLOAT32", "BOOL"]))
    output_type = draw(st.sampled_from(["INT32", "INT64"]))
    axis_type = draw(st.sampled_from(["INT32", "INT64"]))
    shape = draw(shapes(min_rank=1, max_rank=4, max_side=7))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    seed = draw(seeds)
    values = values_of(seed, shape, type_name, special=draw(st.booleans()))
    if draw(st.booleans()) and type_name != "BOOL":  # few distinct values: ties on most rows
        values = (values % 3).astype(values.dtype) if type_name != "FLOAT32" else np.floor(values % 3)
    normalized = axis + len(shape) if axis < 0 else axis
    output = shape[:normalized] + shape[normalized + 1:]
    g = GraphBuilder()
    quantized = dict(scale=0.1, zero_point=3) if type_name in ("INT8", "UINT8") else {}
    x = g.tensor("input", shape, type_name, **quantized)
    y = g.tensor("output", output, output_type)
    from ai_edge_litert import schema_py_generated as schema

    g.op(opcode, [x, g.constant("axis", [axis], axis_type)], [y],
         "ArgMaxOptions" if opcode == "ARG_MAX" else "ArgMinOptions",
         outputType=getattr(schema.TensorType, output_type))
    return case(g.build([x], [y]), [values], opcode=opcode, type=type_name, output_type=output_type, shape=shape,
                axis=axis, seed=seed)


@OP_SETTINGS
@given(arg_min_max_models())
def test_arg_max_and_arg_min(reference, example):
    assert_matches_reference(reference, example)


@pytest.mark.parametrize("row,vector,loop", [
    # (values, (arg max, arg min) on a last axis (ArgMaxVector), the same with a dimension after the axis)
    # a NaN first: the 4 lanes' horizontal maximum as NEON_2_SSE computes it stays NaN, so 0; the loop passes it
    ([np.nan, 1, 2, 0], (0, 0), (2, 3)),
    ([np.nan, 3, 4, 5, 6, 7, 8], (6, 4), (6, 1)),  # ... then the scalar tail replaces the NaN: 6 (min: 4)
    ([1, np.nan, 0, 2], (3, 2), (3, 2)),       # a NaN later is passed over by both
    ([np.nan, -np.inf, np.nan], (1, 1), (1, 1)),  # under 4 values: the NaN-aware scalar loop only
    ([np.nan, np.nan], (0, 0), (0, 0)),        # all NaN: 0
    ([0.0, -0.0, 0.0], (0, 0), (0, 0)),        # signed zeros tie: the first
    ([3, 3, 1, 1], (0, 2), (0, 2)),            # ties: the first
    ([-np.inf, np.nan, -np.inf], (0, 0), (0, 0)),
])
def test_arg_max_edge_cases(reference, row, vector, loop):
    from app.emulator.kernels.reduce import arg_min_max

    last_axis = np.array([row], np.float32)  # [1, n], axis 1
    with_inner = np.stack([last_axis.T, last_axis.T], axis=-1)  # [n, 1, 2], axis 0: the reference loop
    for x, axis, expected in ((last_axis, 1, vector), (with_inner, 0, loop)):
        for opcode, want, is_arg_max in (("ARG_MAX", expected[0], True), ("ARG_MIN", expected[1], False)):
            got = arg_min_max(x, axis, is_arg_max, np.dtype(np.int64))
            assert np.all(got == want), (opcode, x.shape, got)
            g = GraphBuilder()
            t = g.tensor("input", x.shape, "FLOAT32")
            output_shape = x.shape[:axis] + x.shape[axis + 1:]
            y = g.tensor("output", output_shape, "INT64")
            g.op(opcode, [t, g.constant("axis", [axis])], [y], "ArgMaxOptions" if is_arg_max else "ArgMinOptions",
                 outputType=4)
            assert_matches_reference(reference, g.build([t], [y]), [x])
