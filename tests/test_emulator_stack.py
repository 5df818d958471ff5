"""PACK, UNPACK, SPLIT, SPLIT_V against BUILTIN_REF, on every type each kernel takes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.emulator import Interpreter, UnsupportedOperators
from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
    shapes,
    values_of,
)
from tests.tflite_builder import GraphBuilder

PACK_TYPES = ["INT8", "UINT8", "INT16", "INT32", "INT64", "FLOAT32"]
UNPACK_TYPES = ["INT8", "UINT8", "INT16", "INT32", "FLOAT32", "BOOL"]


def _tensor(g: GraphBuilder, name: str, shape, type_name: str, q=None, data=None) -> int:
    if type_name in ("INT8", "UINT8"):
        return g.tensor(name, shape, type_name, scale=q[0], zero_point=q[1], data=data)
    return g.tensor(name, shape, type_name, data=data)


@st.composite
def pack_models(draw):
    type_name = draw(st.sampled_from(PACK_TYPES))
    q = draw(quantization("INT8" if type_name != "UINT8" else "UINT8"))
    shape = draw(shapes(min_rank=0, max_rank=4, max_side=5))
    count = draw(st.integers(1, 4))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    normalized = axis + len(shape) + 1 if axis < 0 else axis
    output_shape = shape[:normalized] + (count,) + shape[normalized:]
    seed = draw(seeds)
    repeated = draw(st.booleans())  # tf.stack([x] * n): the same tensor n times, as TF2 detectors upsample
    # or one input a constant (an anchor grid, say)
    constant = -1 if repeated else draw(st.integers(-1, count - 1))
    g = GraphBuilder()
    values = [values_of(seed + i, shape, type_name) for i in range(count)]
    xs, inputs = [], []
    for i in range(count):
        if repeated and i > 0:
            xs.append(xs[0])
            continue
        if i == constant:
            xs.append(_tensor(g, f"constant{i}", shape, type_name, q, data=values[i]))
        else:
            xs.append(_tensor(g, f"input{i}", shape, type_name, q))
            inputs.append(values[i])
    y = _tensor(g, "output", output_shape, type_name, q)
    g.op("PACK", xs, [y], "PackOptions", valuesCount=count, axis=axis)
    runtime = [x for i, x in enumerate(xs) if x not in xs[:i] and g.tensors[x].buffer == 0]
    return case(g.build(runtime, [y]), inputs, type=type_name, shape=shape, count=count, axis=axis,
                constant=constant, repeated=repeated)


@OP_SETTINGS
@given(pack_models())
def test_pack(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def unpack_models(draw):
    type_name = draw(st.sampled_from(UNPACK_TYPES))
    q = draw(quantization("INT8" if type_name != "UINT8" else "UINT8"))
    shape = draw(shapes(min_rank=1, max_rank=4, max_side=5))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    normalized = axis + len(shape) if axis < 0 else axis
    count = shape[normalized]
    output_shape = shape[:normalized] + shape[normalized + 1:]
    seed = draw(seeds)
    g = GraphBuilder()
    x = _tensor(g, "input", shape, type_name, q)
    ys = [_tensor(g, f"output{i}", output_shape, type_name, q) for i in range(count)]
    g.op("UNPACK", [x], ys, "UnpackOptions", num=count, axis=axis)
    return case(g.build([x], ys), [values_of(seed, shape, type_name)], type=type_name, shape=shape, axis=axis)


@OP_SETTINGS
@given(unpack_models())
def test_unpack(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def split_models(draw):
    type_name = draw(st.sampled_from(PACK_TYPES))
    q = draw(quantization("INT8" if type_name != "UINT8" else "UINT8"))
    output_q = draw(quantization("INT8" if type_name != "UINT8" else "UINT8"))  # not read by the kernel
    shape = list(draw(shapes(min_rank=1, max_rank=4, max_side=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    normalized = axis + len(shape) if axis < 0 else axis
    seed = draw(seeds)
    g = GraphBuilder()
    if draw(st.booleans()):
        count = draw(st.integers(1, 3))
        shape[normalized] *= count
        sizes = [shape[normalized] // count] * count
        x = _tensor(g, "input", shape, type_name, q)
        ys = [_tensor(g, f"output{i}", shape[:normalized] + [s] + shape[normalized + 1:], type_name, output_q)
              for i, s in enumerate(sizes)]
        g.op("SPLIT", [g.constant("axis", [axis]), x], ys, "SplitOptions", numSplits=count)
        opcode = "SPLIT"
    else:
        sizes = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(1, 4)))]
        shape[normalized] = max(sum(sizes), 1)
        sizes[-1] += shape[normalized] - sum(sizes)
        written = list(sizes)
        if draw(st.booleans()):
            written[draw(st.integers(0, len(sizes) - 1))] = -1
        x = _tensor(g, "input", shape, type_name, q)
        ys = [_tensor(g, f"output{i}", shape[:normalized] + [s] + shape[normalized + 1:], type_name, output_q)
              for i, s in enumerate(sizes)]
        size_type = draw(st.sampled_from(["INT32", "INT64"]))
        g.op("SPLIT_V", [x, g.constant("size_splits", written, size_type), g.constant("axis", [axis])], ys,
             "SplitVOptions", numSplits=len(sizes))
        opcode = "SPLIT_V"
    return case(g.build([x], ys), [values_of(seed, shape, type_name)], opcode=opcode, type=type_name,
                shape=shape, axis=axis, sizes=sizes)


@OP_SETTINGS
@given(split_models())
def test_split_and_split_v(reference, example):
    assert_matches_reference(reference, example)


def test_pack_refuses_what_tflite_refuses(reference):
    """Different quantization on a PACK input, and BOOL (which pack.cc does not take)."""
    g = GraphBuilder()
    a = g.tensor("a", (2, 3), "INT8", scale=0.1, zero_point=0)
    b = g.tensor("b", (2, 3), "INT8", scale=0.2, zero_point=0)
    y = g.tensor("y", (2, 2, 3), "INT8", scale=0.1, zero_point=0)
    g.op("PACK", [a, b], [y], "PackOptions", valuesCount=2, axis=0)
    model = g.build([a, b], [y])
    assert "Refused" in type(reference.run(model, [np.zeros((2, 3), np.int8)] * 2)).__name__
    with pytest.raises(UnsupportedOperators, match=r"PACK \(operator 0\): PACK: tensor 'b' is quantized"):
        Interpreter(model_content=model)
    g = GraphBuilder()
    a = g.tensor("a", (2,), "BOOL")
    y = g.tensor("y", (1, 2), "BOOL")
    g.op("PACK", [a], [y], "PackOptions", valuesCount=1, axis=0)
    with pytest.raises(UnsupportedOperators, match="expected INT8 or UINT8 or INT16"):
        Interpreter(model_content=g.build([a], [y]))
