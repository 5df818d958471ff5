"""MEAN and SUM against BUILTIN_REF, through each of TFLite's kernels for them."""

from __future__ import annotations

import numpy as np
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
