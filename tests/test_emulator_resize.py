"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR against BUILTIN_REF: up and down, align_corners, half_pixel_centers;
int8, uint8 and float32 (float tails), and int32 for nearest."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
    values_of,
)
from tests.tflite_builder import GraphBuilder


@st.composite
def resize_models(draw, opcode: str, options: str, types=("INT8", "UINT8", "FLOAT32")):
    type_name = draw(st.sampled_from(types))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 4)))
    size = [draw(st.integers(1, 16)), draw(st.integers(1, 16))]
    mode = draw(st.sampled_from(["plain", "align_corners", "half_pixel_centers"]))
    q = draw(quantization(type_name if type_name in ("INT8", "UINT8") else "INT8"))
    seed = draw(seeds)
    g = GraphBuilder()
    quantized = dict(scale=q[0], zero_point=q[1]) if type_name in ("INT8", "UINT8") else {}
    x = g.tensor("input", shape, type_name, **quantized)
    s = g.constant("size", np.asarray(size, np.int32))
    y = g.tensor("output", (shape[0], *size, shape[3]), type_name, **quantized)
    g.op(opcode, [x, s], [y], options, version=3, alignCorners=mode == "align_corners",
         halfPixelCenters=mode == "half_pixel_centers")
    special = draw(st.booleans())  # NaN, infinities and -0.0 among float inputs, or ordinary values only
    return case(g.build([x], [y]), [values_of(seed, shape, type_name, special=special)], type=type_name, shape=shape,
                size=size, mode=mode, seed=seed)


@OP_SETTINGS
@given(resize_models("RESIZE_BILINEAR", "ResizeBilinearOptions"))
def test_resize_bilinear(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(resize_models("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", ("INT8", "UINT8", "FLOAT32", "INT32")))
def test_resize_nearest_neighbor(reference, example):
    assert_matches_reference(reference, example)
