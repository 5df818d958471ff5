"""Ops that move values without arithmetic, or nearly: RESHAPE, SQUEEZE, EXPAND_DIMS, CONCATENATION, PAD,
SLICE, STRIDED_SLICE, SPACE_TO_DEPTH, TRANSPOSE, TILE, GATHER, GATHER_ND.

Each runs on 8-bit quantized tensors and on the float32, integer and boolean tensors of float tails
(bytes copied whatever the type). The only arithmetic is CONCATENATION's rescaling of a uint8 input
whose quantization differs from the output's (reference_ops::ConcatenationWithScaling, in float): a
table per input. GATHER and GATHER_ND take their indices from the model or from another operator
(MoveNet gathers offsets at its heatmaps' maxima); an index outside the input fails the invoke, as
in TFLite.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import InvokeFailed, Unsupported
from app.emulator.kernels.common import QUANTIZED_TYPES, OpView, Step, per_tensor, same_type
from app.emulator.kernels.quantize import ByteTable

f32 = np.float32


def _check_types(view: OpView, positions=(0,)) -> np.dtype:
    """The type the op's inputs at `positions` and its output share: any type a kernel here reads."""
    return same_type(view, positions)


def prepare_reshape(view: OpView) -> Step:
    """RESHAPE, SQUEEZE, EXPAND_DIMS: the same bytes under the output's (static) shape."""
    _check_types(view)
    shape = view.output().shape
    if int(np.prod(shape)) != int(np.prod(view.input(0).shape)):
        raise Unsupported(f"cannot reshape {view.input(0).shape} to {shape}")

    def run(x: np.ndarray) -> np.ndarray:
        return x.reshape(shape)

    return view.step_binding(run, 0)


def concatenation_with_scaling_table(input_scale: float, input_zero_point: int, output_scale: float,
                                     output_zero_point: int) -> ByteTable:
    """reference_ops::ConcatenationWithScaling for one uint8 input: round(x * scale + bias) + zero point, clamped."""
    inverse_output_scale = f32(1) / f32(output_scale)
    scale = f32(f32(input_scale) * inverse_output_scale)
    bias = f32(f32(-input_zero_point) * scale)

    def kernel(q):
        value = (q.astype(f32) * scale).astype(f32) + bias
        rounded = np.copysign(np.floor(np.abs(value) + f32(0.5)), value).astype(np.int64) + output_zero_point
        return np.clip(rounded, 0, 255)

    return ByteTable(kernel, np.dtype(np.uint8), np.dtype(np.uint8))


def prepare_concatenation(view: OpView) -> Step:
    positions = tuple(range(len(view.operator.inputs)))
    dtype = _check_types(view, positions)
    if view.options.get("fusedActivationFunction", 0) not in (0, "NONE"):
        raise Unsupported("a fused activation on CONCATENATION is not supported by TFLite")
    rank = len(view.input(0).shape)
    axis = view.options.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    if rank == 0:  # scalars (index arithmetic): concatenated into a vector, as TFLite's Prepare does
        if axis != 0 or any(view.input(p).shape != () for p in positions):
            raise Unsupported("scalars concatenate along axis 0 only, with scalars")
        return view.step_binding(lambda *values: np.stack(values), *positions)
    if not 0 <= axis < rank:
        raise Unsupported(f"axis {view.options.get('axis', 0)} for inputs of rank {rank}")
    if view.output().type not in QUANTIZED_TYPES:
        return view.step_binding(lambda *values: np.concatenate(values, axis=axis), *positions)
    _, output_scale, output_zero_point = per_tensor(view.output(), "output")
    rescale = {}
    for position in positions:
        _, scale, zero_point = per_tensor(view.input(position), f"input {position}")
        if (scale, zero_point) != (output_scale, output_zero_point):
            if dtype == np.int8:
                raise Unsupported("int8 inputs must share the output's scale and zero point (TFLite's check)")
            rescale[position] = concatenation_with_scaling_table(scale, zero_point, output_scale, output_zero_point)
    constants = {p: view.input(p).data for p in positions if view.input(p).data is not None}
    runtime = [p for p in positions if p not in constants]

    def run(*arrays):
        values = dict(zip(runtime, arrays, strict=True)) | constants
        parts = [rescale[p](values[p]) if p in rescale else values[p] for p in positions]
        return np.concatenate(parts, axis=axis)

    return view.step(run, *runtime)


def prepare_pad(view: OpView) -> Step:
    """PAD (and PADV2 with a constant value): the padding value is the output zero point by default
    (0 for unquantized types)."""
    dtype = _check_types(view)
    paddings = np.asarray(view.constant(1, "paddings"), np.int64).reshape(-1, 2)
    if (paddings < 0).any():
        raise Unsupported("negative paddings")
    if paddings.shape[0] != len(view.input(0).shape):
        raise Unsupported(f"paddings {paddings.tolist()} for a rank-{len(view.input(0).shape)} input")
    value = np.zeros((), dtype)
    if view.output().type in QUANTIZED_TYPES:
        _, input_scale, input_zero_point = per_tensor(view.input(0), "input")
        _, output_scale, output_zero_point = per_tensor(view.output(), "output")
        if (input_scale, input_zero_point) != (output_scale, output_zero_point):
            raise Unsupported("input and output quantization must be equal (TFLite's check)")
        value = np.asarray(output_zero_point, dtype)
    if view.input(2) is not None:
        if view.input(2).type != view.output().type:
            raise Unsupported(f"constant value is {view.input(2).type}, output {view.output().type}")
        value = np.asarray(view.constant(2, "constant value")).reshape(-1)[0]
    pad_width = [tuple(p) for p in paddings.tolist()]

    def run(x: np.ndarray) -> np.ndarray:
        return np.pad(x, pad_width, constant_values=value)

    return view.step_binding(run, 0)


def prepare_slice(view: OpView) -> Step:
    _check_types(view)
    shape = view.input(0).shape
    begin = np.asarray(view.constant(1, "begin"), np.int64).reshape(-1)
    size = np.asarray(view.constant(2, "size"), np.int64).reshape(-1)
    if begin.size != len(shape) or size.size != len(shape):
        raise Unsupported(f"begin {begin.tolist()} and size {size.tolist()} must have one entry per dimension")
    index = []
    for dim, (start, length) in enumerate(zip(begin.tolist(), size.tolist(), strict=True)):
        stop = shape[dim] if length == -1 else start + length
        if not 0 <= start <= stop <= shape[dim]:
            raise Unsupported(f"slice {start}:{stop} is outside dimension {dim} of size {shape[dim]}")
        index.append(slice(start, stop))
    index = tuple(index)

    def run(x: np.ndarray) -> np.ndarray:
        return x[index].copy()

    return view.step_binding(run, 0)


def strided_slice_indices(shape, begin, end, strides, begin_mask: int, end_mask: int, shrink_axis_mask: int,
                          offset: bool) -> list[np.ndarray]:
    """StartForAxis / StopForAxis (strided_slice_logic.h): the indices taken along each axis."""
    indices = []
    for axis, size in enumerate(shape):
        stride = int(strides[axis])
        if stride == 0:
            raise Unsupported("a stride of 0")
        start = int(begin[axis])
        stop = int(end[axis])
        if offset:
            stop = start + stop
        if begin_mask & (1 << axis):
            start = 0 if stride > 0 else size - 1
        else:
            start = start + size if start < 0 else start
            start = min(max(start, 0), size) if stride > 0 else min(max(start, -1), size - 1)
        if shrink_axis_mask & (1 << axis):
            stop = start + 1
            stride = 1
        elif end_mask & (1 << axis):
            stop = size if stride > 0 else -1
        else:
            stop = stop + size if stop < 0 else stop
            stop = min(max(stop, 0), size) if stride > 0 else min(max(stop, -1), size - 1)
        indices.append(np.arange(start, stop, stride, dtype=np.int64))
    return indices


def prepare_strided_slice(view: OpView) -> Step:
    _check_types(view)
    o = view.options
    if o.get("ellipsisMask", 0) or o.get("newAxisMask", 0):
        raise Unsupported("ellipsis_mask and new_axis_mask are not emulated")
    shape = view.input(0).shape
    begin = np.asarray(view.constant(1, "begin")).reshape(-1)
    end = np.asarray(view.constant(2, "end")).reshape(-1)
    strides = np.asarray(view.constant(3, "strides")).reshape(-1)
    if not begin.size == end.size == strides.size == len(shape):
        raise Unsupported("begin, end and strides must have one entry per dimension")
    indices = strided_slice_indices(shape, begin, end, strides, o.get("beginMask", 0), o.get("endMask", 0),
                                    o.get("shrinkAxisMask", 0), bool(o.get("offset", False)))
    output_shape = view.output().shape
    grid = np.ix_(*indices)
    if int(np.prod([i.size for i in indices])) != int(np.prod(output_shape)):
        raise Unsupported(f"the slice has {[i.size for i in indices]} elements per axis; output {output_shape}")

    def run(x: np.ndarray) -> np.ndarray:
        return x[grid].reshape(output_shape)

    return view.step_binding(run, 0)


def prepare_space_to_depth(view: OpView) -> Step:
    _check_types(view)
    block = view.options.get("blockSize", 0)
    n, h, w, c = view.input(0).shape
    if block < 1 or h % block or w % block:
        raise Unsupported(f"block size {block} does not divide {h}x{w}")

    def run(x: np.ndarray) -> np.ndarray:
        """out[n, y, x, (by * block + bx) * c + k] = in[n, y * block + by, x * block + bx, k]."""
        blocks = x.reshape(n, h // block, block, w // block, block, c)
        return blocks.transpose(0, 1, 3, 2, 4, 5).reshape(n, h // block, w // block, block * block * c)

    return view.step_binding(run, 0)


def transpose(input_data: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    """reference_ops::Transpose: output dimension i is input dimension perm[i]; bytes copied, no rescaling."""
    return np.ascontiguousarray(input_data.transpose(perm))


def prepare_transpose(view: OpView) -> Step:
    _check_types(view)
    shape = view.input(0).shape
    perm = tuple(int(p) for p in np.asarray(view.constant(1, "perm")).reshape(-1))
    if sorted(perm) != list(range(len(shape))):
        raise Unsupported(f"perm {list(perm)} is not a permutation of the {len(shape)} dimensions (TFLite's check)")
    output_shape = tuple(shape[p] for p in perm)
    if output_shape != view.output().shape:
        raise Unsupported(f"transposing {shape} by {list(perm)} gives {output_shape}; output {view.output().shape}")

    def run(x: np.ndarray) -> np.ndarray:
        return transpose(x, perm)

    return view.step_binding(run, 0)


def tile(input_data: np.ndarray, multiples: tuple[int, ...]) -> np.ndarray:
    """reference Tile (kernels/tile.cc TileOneDimension): each dimension repeated whole, `multiples[i]` times."""
    return np.tile(input_data, multiples)


def prepare_tile(view: OpView) -> Step:
    """TILE with constant multiples (Keras' UpSampling2D writes nearest-neighbour upsampling as TILE + RESHAPE)."""
    _check_types(view)
    shape = view.input(0).shape
    if view.input(1).type not in ("INT32", "INT64"):
        raise Unsupported(f"multiples are {view.input(1).type}; expected INT32 or INT64")
    multiples = tuple(int(m) for m in np.asarray(view.constant(1, "multiples")).reshape(-1))
    if len(multiples) != len(shape) or min(multiples, default=1) < 0:
        raise Unsupported(f"multiples {list(multiples)} for an input of rank {len(shape)}")
    output_shape = tuple(d * m for d, m in zip(shape, multiples, strict=True))
    if output_shape != view.output().shape:
        raise Unsupported(f"tiling gives {output_shape}; output {view.output().shape}")

    def run(x: np.ndarray) -> np.ndarray:
        return tile(x, multiples)

    return view.step_binding(run, 0)


def gather(input_data: np.ndarray, coords: np.ndarray, axis: int, batch_dims: int) -> np.ndarray:
    """reference_ops::Gather: slices of input along axis at coords, per batch; bytes copied, no rescaling.

    input viewed as [batch, outer, axis, inner] and coords as [batch, coord]:
    out[b, o, c, i] = input[b, o, coords[b, c], i].
    """
    shape = input_data.shape
    batch_size = int(np.prod(shape[:batch_dims], dtype=np.int64))
    outer = int(np.prod(shape[batch_dims:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    blocks = input_data.reshape(batch_size, outer, shape[axis], inner)
    coords = coords.reshape(batch_size, -1)
    return np.stack([blocks[b].take(coords[b], axis=1) for b in range(batch_size)])


def _indices(view: OpView) -> np.ndarray | None:
    """GATHER's and GATHER_ND's second input: integer indices as int64 when the model holds them, else None."""
    positions = view.input(1)
    if positions.type not in ("INT16", "INT32", "INT64"):
        raise Unsupported(f"indices are {positions.type}; expected INT16, INT32 or INT64")
    return None if positions.data is None else np.asarray(positions.data, np.int64)


def check_gather_indices(coords: np.ndarray, size: int, axis: int) -> None:
    """Gather's checks at Eval: no negative index (TF_LITE_ENSURE), none past the axis ("gather index out of
    bounds"); InvokeFailed, as TFLite's invoke fails."""
    if coords.size and (coords.min() < 0 or coords.max() >= size):
        raise InvokeFailed(f"GATHER: indices {coords.min()}..{coords.max()} are outside dimension {axis} of size "
                           f"{size} (gather index out of bounds)")


def prepare_gather(view: OpView) -> Step:
    """GATHER with indices from the model (channels, rows) or computed (an argmax)."""
    _check_types(view)
    source, output = view.input(0), view.output()
    constant = _indices(view)
    coords_shape = view.input(1).shape
    rank = len(source.shape)
    axis = view.options.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    batch_dims = view.options.get("batchDims", 0)
    batch_dims = batch_dims + len(coords_shape) if batch_dims < 0 else batch_dims
    if not 0 <= axis < rank or not 0 <= batch_dims <= axis or batch_dims > len(coords_shape):
        raise Unsupported(f"axis {axis} and batch_dims {batch_dims} for an input of rank {rank} and indices of "
                          f"rank {len(coords_shape)} (TFLite requires 0 <= batch_dims <= axis < rank)")
    if source.shape[:batch_dims] != coords_shape[:batch_dims]:
        raise Unsupported(f"the first {batch_dims} dimensions of input {source.shape} and indices {coords_shape} "
                          "differ")
    if constant is not None:
        try:
            check_gather_indices(constant, source.shape[axis], axis)
        except InvokeFailed as e:
            raise Unsupported(f"{e} (TFLite fails such a gather)") from None
    output_shape = source.shape[:axis] + coords_shape[batch_dims:] + source.shape[axis + 1:]
    if output_shape != output.shape:
        raise Unsupported(f"gathering gives {output_shape}; output {output.shape}")

    def run(x: np.ndarray, coords: np.ndarray) -> np.ndarray:
        coords = np.asarray(coords, np.int64)
        if constant is None:
            check_gather_indices(coords, source.shape[axis], axis)
        return gather(x, coords, axis, batch_dims).reshape(output_shape)

    return view.step_binding(run, 0, 1)


def gather_nd(params_data: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """reference_ops::GatherNd: indices [..., K] pick slices params[i_0, ..., i_(K-1)]; bytes copied."""
    return params_data[tuple(np.moveaxis(indices, -1, 0))]


def check_gather_nd_indices(indices: np.ndarray, bounds: tuple[int, ...]) -> None:
    """GatherNd's checks at Eval: no negative index, none at or past its dimension ("gather_nd index out of
    bounds"); InvokeFailed, as TFLite's invoke fails."""
    if indices.size and ((indices < 0).any() or (indices >= np.asarray(bounds, np.int64)).any()):
        raise InvokeFailed(f"GATHER_ND: indices outside the input's {bounds} (gather_nd index out of bounds)")


def prepare_gather_nd(view: OpView) -> Step:
    """GATHER_ND with indices from the model (litert-torch writes index_select as one) or computed (MoveNet
    reads its offsets at the heatmaps' argmax)."""
    _check_types(view)
    source, output = view.input(0), view.output()
    constant = _indices(view)
    indices_shape = view.input(1).shape
    depth = indices_shape[-1] if indices_shape else 0
    if not indices_shape or not 1 <= depth <= len(source.shape):
        raise Unsupported(f"indices {indices_shape} for an input of rank {len(source.shape)}: the last dimension "
                          "must be between 1 and the input's rank")
    bounds = source.shape[:depth]
    if constant is not None:
        try:
            check_gather_nd_indices(constant, bounds)
        except InvokeFailed as e:
            raise Unsupported(f"{e} (TFLite fails such a gather)") from None
    output_shape = indices_shape[:-1] + source.shape[depth:]
    if output_shape != output.shape:
        raise Unsupported(f"gathering gives {output_shape}; output {output.shape}")

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, np.int64)
        if constant is None:
            check_gather_nd_indices(indices, bounds)
        return np.array(gather_nd(x, indices))

    return view.step_binding(run, 0, 1)


PREPARE = {
    "RESHAPE": prepare_reshape,
    "SQUEEZE": prepare_reshape,
    "EXPAND_DIMS": prepare_reshape,
    "CONCATENATION": prepare_concatenation,
    "PAD": prepare_pad,
    "PADV2": prepare_pad,
    "SLICE": prepare_slice,
    "STRIDED_SLICE": prepare_strided_slice,
    "SPACE_TO_DEPTH": prepare_space_to_depth,
    "TRANSPOSE": prepare_transpose,
    "TILE": prepare_tile,
    "GATHER": prepare_gather,
    "GATHER_ND": prepare_gather_nd,
}
