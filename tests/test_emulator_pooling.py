"""MAX_POOL_2D and AVERAGE_POOL_2D against BUILTIN_REF: windows, strides, paddings, activations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.emulator.kernels.common import compute_padding
from tests.emulator_cases import (
    OP_SETTINGS,
    activations,
    assert_matches_reference,
    case,
    every_byte,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
)
from tests.tflite_builder import GraphBuilder


@st.composite
def pool_models(draw, opcode: str):
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    batch, height, width, depth = (draw(st.integers(1, 2)), draw(st.integers(1, 14)), draw(st.integers(1, 14)),
                                   draw(st.integers(1, 6)))
    fh, fw = draw(st.integers(1, 14)), draw(st.integers(1, 14))  # up to a global pool (DeepLab's image pooling)
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if padding == "VALID":
        height, width = max(height, fh), max(width, fw)
    q = draw(quantization(type_name))
    activation = draw(activations)
    seed = draw(seeds)
    p = compute_padding(padding, height, width, fh, fw, sh, sw)
    g = GraphBuilder()
    x = g.tensor("input", (batch, height, width, depth), type_name, scale=q[0], zero_point=q[1])
    y = g.tensor("output", (batch, p.output_height, p.output_width, depth), type_name, scale=q[0], zero_point=q[1])
    g.op(opcode, [x], [y], "Pool2DOptions", version=2, padding=padding, strideH=sh, strideW=sw, filterHeight=fh,
         filterWidth=fw, fusedActivationFunction=activation)
    return case(g.build([x], [y]), [every_byte(seed, (batch, height, width, depth), type_name)], type=type_name,
                input=(batch, height, width, depth), filter=(fh, fw), stride=(sh, sw), padding=padding,
                activation=activation, q=q, seed=seed)


@OP_SETTINGS
@given(pool_models("MAX_POOL_2D"))
def test_max_pool_2d(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(pool_models("AVERAGE_POOL_2D"))
def test_average_pool_2d(reference, example):
    assert_matches_reference(reference, example)
