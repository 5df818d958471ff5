"""RESHAPE, SQUEEZE, EXPAND_DIMS, CONCATENATION, PAD, PADV2, SLICE, STRIDED_SLICE, SPACE_TO_DEPTH, TRANSPOSE, GATHER,
GATHER_ND against BUILTIN_REF: 8-bit quantized tensors half the time, float32, int16/32/64 and bool the other half
(float tails), with GATHER and GATHER_ND indices from the model or computed at run time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from app.emulator import InvokeFailed

from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    quantization,
    reference,  # noqa: F401 (fixture)
    run_emulator,
    seeds,
    shapes,
    values_of,
)
from tests.tflite_builder import GraphBuilder

EIGHT_BIT = ["INT8", "UINT8"]
types = st.one_of(st.sampled_from(EIGHT_BIT), st.sampled_from(["FLOAT32", "INT32", "INT64", "INT16", "BOOL"]))


def every_byte(seed, shape, type_name):
    """Every byte of an 8-bit type; random values with their extremes (and NaN, infinities, -0.0) of the others."""
    return values_of(seed, shape, type_name)


def _quantized(draw, type_name):
    """A quantization for 8-bit tensors (unused by the others)."""
    return draw(quantization(type_name if type_name in EIGHT_BIT else "INT8"))


def _tensor(g, name, shape, type_name, q, data=None):
    if type_name in EIGHT_BIT:
        return g.tensor(name, shape, type_name, scale=q[0], zero_point=q[1], data=data)
    return g.tensor(name, shape, type_name, data=data)


def _single(opcode, type_name, q, input_shape, output_shape, constants=(), options=None, version=1, **fields):
    g = GraphBuilder()
    x = _tensor(g, "input", input_shape, type_name, q)
    extra = [g.constant(f"c{i}", np.asarray(c, np.int32)) for i, c in enumerate(constants)]
    y = _tensor(g, "output", output_shape, type_name, q)
    g.op(opcode, [x, *extra], [y], options, version=version, **fields)
    return g.build([x], [y])


@st.composite
def reshape_like(draw):
    type_name, q, seed = draw(types), _quantized(draw, "INT8"), draw(seeds)
    q = (q[0], int(np.clip(q[1], 0, 127)))
    shape = draw(shapes(max_side=6))
    opcode = draw(st.sampled_from(["RESHAPE", "SQUEEZE", "EXPAND_DIMS"]))
    if opcode == "RESHAPE":
        size = int(np.prod(shape))
        output = (size,) if draw(st.booleans()) else (1, size)
        model = _single("RESHAPE", type_name, q, shape, output, [list(output)], "ReshapeOptions", newShape=list(output))
    elif opcode == "SQUEEZE":
        shape = shape + (1,)
        output = tuple(d for d in shape if d != 1)
        model = _single("SQUEEZE", type_name, q, shape, output, (), "SqueezeOptions", squeezeDims=[])
    else:
        axis = draw(st.integers(0, len(shape)))
        output = shape[:axis] + (1,) + shape[axis:]
        model = _single("EXPAND_DIMS", type_name, q, shape, output, [[axis]])
    return case(model, [every_byte(seed, shape, type_name)], opcode=opcode, type=type_name, shape=shape)


@OP_SETTINGS
@given(reshape_like())
def test_reshape_squeeze_expand_dims(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def concatenation_models(draw):
    type_name = draw(types)
    base = draw(shapes(max_side=5))
    axis = draw(st.integers(0, len(base) - 1))
    count = draw(st.integers(1, 4))
    output_q = _quantized(draw, type_name)
    parts, qs = [], []
    for _ in range(count):
        parts.append(base[:axis] + (draw(st.integers(1, 4)),) + base[axis + 1:])
        same = type_name != "UINT8" or draw(st.booleans())  # int8 inputs must share the output's quantization
        qs.append(output_q if same else _quantized(draw, type_name))
    output_shape = base[:axis] + (sum(p[axis] for p in parts),) + base[axis + 1:]
    seed = draw(seeds)
    g = GraphBuilder()
    xs = [_tensor(g, f"input{i}", p, type_name, q) for i, (p, q) in enumerate(zip(parts, qs))]
    y = _tensor(g, "output", output_shape, type_name, output_q)
    negative_axis = draw(st.booleans())
    g.op("CONCATENATION", xs, [y], "ConcatenationOptions", axis=axis - len(base) if negative_axis else axis)
    inputs = [every_byte(seed + i, p, type_name) for i, p in enumerate(parts)]
    return case(g.build(xs, [y]), inputs, type=type_name, parts=parts, axis=axis, qs=qs, output_q=output_q)


@OP_SETTINGS
@given(concatenation_models())
def test_concatenation(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def pad_models(draw):
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_side=6))
    paddings = [[draw(st.integers(0, 3)), draw(st.integers(0, 3))] for _ in shape]
    output = tuple(d + a + b for d, (a, b) in zip(shape, paddings, strict=True))
    if draw(st.booleans()):
        model = _single("PAD", type_name, q, shape, output, [paddings], "PadOptions")
        value = None
    else:
        value = every_byte(seed + 1, (1,), type_name)[0].item()
        g = GraphBuilder()
        x = _tensor(g, "input", shape, type_name, q)
        p = g.constant("paddings", np.asarray(paddings, np.int32))
        v = _tensor(g, "value", (1,), type_name, q, data=[value])
        y = _tensor(g, "output", output, type_name, q)
        g.op("PADV2", [x, p, v], [y], "PadV2Options")
        model = g.build([x], [y])
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, paddings=paddings,
                value=value)


@OP_SETTINGS
@given(pad_models())
def test_pad(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def slice_models(draw):
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_side=7))
    begin = [draw(st.integers(0, d - 1)) for d in shape]
    size = [draw(st.sampled_from([-1, draw(st.integers(1, d - b))])) for d, b in zip(shape, begin, strict=True)]
    output = tuple(d - b if s == -1 else s for d, b, s in zip(shape, begin, size, strict=True))
    model = _single("SLICE", type_name, q, shape, output, [begin, size], "SliceOptions")
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, begin=begin, size=size)


@OP_SETTINGS
@given(slice_models())
def test_slice(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def strided_slice_models(draw):
    from app.emulator.kernels.shape import strided_slice_indices

    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_side=7))
    rank = len(shape)
    begin = [draw(st.integers(-d, d)) for d in shape]
    end = [draw(st.integers(-d, d)) for d in shape]
    strides = [draw(st.sampled_from([1, 1, 2, 3, -1, -2])) for _ in shape]
    begin_mask, end_mask = draw(st.integers(0, 2**rank - 1)), draw(st.integers(0, 2**rank - 1))
    shrink = draw(st.integers(0, 2**rank - 1)) if draw(st.booleans()) else 0
    for axis in range(rank):  # a shrunk axis takes one valid index, as TFLite requires
        if shrink & (1 << axis):
            begin[axis] = draw(st.integers(-shape[axis], shape[axis] - 1))
            strides[axis] = 1
            begin_mask &= ~(1 << axis)
    indices = strided_slice_indices(shape, begin, end, strides, begin_mask, end_mask, shrink, False)
    assume(all(i.size for i in indices))  # an empty slice is no example
    output = tuple(i.size for axis, i in enumerate(indices) if not shrink & (1 << axis))
    model = _single("STRIDED_SLICE", type_name, q, shape, output, [begin, end, strides], "StridedSliceOptions",
                    beginMask=begin_mask, endMask=end_mask, shrinkAxisMask=shrink)
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, begin=begin, end=end,
                strides=strides, begin_mask=begin_mask, end_mask=end_mask, shrink=shrink)


@OP_SETTINGS
@given(strided_slice_models())
def test_strided_slice(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def space_to_depth_models(draw):
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    block = draw(st.integers(1, 3))
    shape = (draw(st.integers(1, 2)), block * draw(st.integers(1, 4)), block * draw(st.integers(1, 4)),
             draw(st.integers(1, 5)))
    output = (shape[0], shape[1] // block, shape[2] // block, shape[3] * block * block)
    model = _single("SPACE_TO_DEPTH", type_name, q, shape, output, (), "SpaceToDepthOptions", blockSize=block)
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, block=block)


@OP_SETTINGS
@given(space_to_depth_models())
def test_space_to_depth(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def transpose_models(draw):
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_rank=6, max_side=5))
    perm = draw(st.permutations(range(len(shape))))
    output = tuple(shape[p] for p in perm)
    model = _single("TRANSPOSE", type_name, q, shape, output, [perm], "TransposeOptions")
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, perm=perm)


@OP_SETTINGS
@given(transpose_models())
def test_transpose(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def gather_models(draw):
    """Constant indices (a channel shuffle, a row pick), any axis, batch_dims, INT32 or INT64 indices."""
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_rank=4, max_side=6))
    axis = draw(st.integers(0, len(shape) - 1))
    batch_dims = draw(st.integers(0, axis))
    index_shape = shape[:batch_dims] + tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
    indices = np.random.default_rng(seed).integers(0, shape[axis], index_shape)
    index_type = draw(st.sampled_from(["INT32", "INT64"]))
    output = shape[:axis] + index_shape[batch_dims:] + shape[axis + 1:]
    negative_axis = draw(st.booleans())
    g = GraphBuilder()
    x = _tensor(g, "input", shape, type_name, q)
    i = g.constant("indices", indices, index_type)
    y = _tensor(g, "output", output, type_name, q)
    g.op("GATHER", [x, i], [y], "GatherOptions", axis=axis - len(shape) if negative_axis else axis,
         batchDims=batch_dims)
    return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], type=type_name, shape=shape, axis=axis,
                batch_dims=batch_dims, indices=indices.tolist(), index_type=index_type)


@OP_SETTINGS
@given(gather_models())
def test_gather(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def gather_nd_models(draw):
    """Constant indices picking whole slices (depth < rank) or single values (depth = rank)."""
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_rank=4, max_side=6))
    depth = draw(st.integers(1, len(shape)))
    batch = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.integers(0, d, batch) for d in shape[:depth]], axis=-1)
    index_type = draw(st.sampled_from(["INT32", "INT64"]))
    output = batch + shape[depth:]
    g = GraphBuilder()
    x = _tensor(g, "input", shape, type_name, q)
    i = g.constant("indices", indices, index_type)
    y = _tensor(g, "output", output, type_name, q)
    g.op("GATHER_ND", [x, i], [y])
    return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], type=type_name, shape=shape,
                indices=indices.tolist(), index_type=index_type)


@OP_SETTINGS
@given(gather_nd_models())
def test_gather_nd(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def computed_gather_models(draw):
    """GATHER and GATHER_ND whose indices are a model input, as an argmax feeds them in MoveNet's tail."""
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_rank=4, max_side=6))
    rng = np.random.default_rng(seed)
    index_type = draw(st.sampled_from(["INT32", "INT64"]))
    g = GraphBuilder()
    x = _tensor(g, "input", shape, type_name, q)
    if draw(st.booleans()):
        opcode = "GATHER"
        axis = draw(st.integers(0, len(shape) - 1))
        batch_dims = draw(st.integers(0, axis))
        index_shape = shape[:batch_dims] + tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
        indices = rng.integers(0, shape[axis], index_shape)
        output = shape[:axis] + index_shape[batch_dims:] + shape[axis + 1:]
        i = g.tensor("indices", index_shape, index_type)
        y = _tensor(g, "output", output, type_name, q)
        g.op("GATHER", [x, i], [y], "GatherOptions", axis=axis, batchDims=batch_dims)
    else:
        opcode = "GATHER_ND"
        depth = draw(st.integers(1, len(shape)))
        batch = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
        indices = np.stack([rng.integers(0, d, batch) for d in shape[:depth]], axis=-1)
        i = g.tensor("indices", indices.shape, index_type)
        y = _tensor(g, "output", batch + shape[depth:], type_name, q)
        g.op("GATHER_ND", [x, i], [y])
    inputs = [every_byte(seed, shape, type_name), indices.astype(np.int32 if index_type == "INT32" else np.int64)]
    return case(g.build([x, i], [y]), inputs, opcode=opcode, type=type_name, shape=shape, indices=indices.tolist())


@OP_SETTINGS
@given(computed_gather_models())
def test_gather_and_gather_nd_with_computed_indices(reference, example):
    assert_matches_reference(reference, example)


@pytest.mark.parametrize("opcode,index", [("GATHER", 4), ("GATHER", -1), ("GATHER_ND", 3), ("GATHER_ND", -1)])
def test_a_computed_index_outside_the_input_fails_the_invoke(reference, opcode, index):
    g = GraphBuilder()
    x = g.tensor("input", (3, 2), "FLOAT32")
    if opcode == "GATHER":
        i = g.tensor("indices", (2,), "INT32")
        y = g.tensor("output", (2, 2), "FLOAT32")
        g.op("GATHER", [x, i], [y], "GatherOptions", axis=0)
        indices = np.array([0, index], np.int32)
    else:
        i = g.tensor("indices", (1, 2), "INT32")
        y = g.tensor("output", (1,), "FLOAT32")
        g.op("GATHER_ND", [x, i], [y])
        indices = np.array([[index, 0]], np.int32)
    model, inputs = g.build([x, i], [y]), [np.ones((3, 2), np.float32), indices]
    assert "Refused" in type(reference.run(model, inputs)).__name__  # TFLite's invoke fails too
    with pytest.raises(InvokeFailed, match="out of bounds"):
        run_emulator(model, inputs)


@st.composite
def tile_models(draw):
    """TILE with constant multiples. Version 2: BUILTIN_REF registers TILE up to 2, though TF 2.21 writes version 3
    for Keras' UpSampling2D (the optimized resolver, and the emulator, run it; the kernel is the same)."""
    type_name, seed = draw(types), draw(seeds)
    q = _quantized(draw, type_name)
    shape = draw(shapes(max_rank=4, max_side=4))
    multiples = [draw(st.integers(1, 3)) for _ in shape]
    output = tuple(d * m for d, m in zip(shape, multiples, strict=True))
    multiples_type = draw(st.sampled_from(["INT32", "INT64"]))
    g = GraphBuilder()
    x = _tensor(g, "input", shape, type_name, q)
    y = _tensor(g, "output", output, type_name, q)
    g.op("TILE", [x, g.constant("multiples", multiples, multiples_type)], [y], version=2)
    return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], type=type_name, shape=shape,
                multiples=multiples)


@OP_SETTINGS
@given(tile_models())
def test_tile(reference, example):
    assert_matches_reference(reference, example)
