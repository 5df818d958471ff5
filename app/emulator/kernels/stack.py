"""PACK, UNPACK, SPLIT and SPLIT_V: tensors stacked along a new axis, or cut along one (kernels/pack.cc,
unpack.cc, split.cc, split_v.cc with reference_ops::Pack, Unpack, Split).

Bytes are copied, never rescaled, whatever the type: TF2 Object Detection API exports stack an 8-bit
feature map with itself for their nearest-neighbour upsampling (PACK, then RESHAPE), YOLO heads split
boxes from classes, and MoveNet's float tail packs and unpacks coordinates. PACK and UNPACK require
equal quantization on every tensor (TFLite checks it at Prepare); SPLIT and SPLIT_V do not look at it.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.kernels.common import OpView, Step, same_quantization, same_type

# Each kernel's Prepare: the types it accepts (pack.cc takes no BOOL, unpack.cc no INT64).
PACK_TYPES = ("INT8", "UINT8", "INT16", "INT32", "INT64", "FLOAT32")
UNPACK_TYPES = ("INT8", "UINT8", "INT16", "INT32", "FLOAT32", "BOOL")
SPLIT_TYPES = ("INT8", "UINT8", "INT16", "INT32", "INT64", "FLOAT32")


def _normalized_axis(axis: int, rank: int, what: str) -> int:
    """A negative axis counts from the end, as each kernel's Prepare adds the rank."""
    normalized = axis + rank if axis < 0 else axis
    if not 0 <= normalized < max(rank, 1):
        raise Unsupported(f"{what} {axis} is outside a rank-{rank} tensor")
    return normalized


def _check_outputs(view: OpView, shapes: list[tuple[int, ...]]) -> None:
    declared = [view.output(i).shape for i in range(len(view.operator.outputs))]
    if declared != shapes:
        raise Unsupported(f"the kernel gives outputs {shapes}; the model declares {declared}")


def pack(input_data: list[np.ndarray], axis: int) -> np.ndarray:
    """reference_ops::Pack: out[..., i, ...] = inputs[i], the new dimension at `axis`."""
    return np.stack(input_data, axis=axis)


def prepare_pack(view: OpView) -> Step:
    count = view.options.get("valuesCount", 0)
    positions = tuple(range(len(view.operator.inputs)))
    if count != len(positions) or count < 1:
        raise Unsupported(f"values_count {count} with {len(positions)} inputs (TFLite requires them equal)")
    same_type(view, positions, PACK_TYPES)
    shape = view.input(0).shape
    for position in positions[1:]:
        if view.input(position).shape != shape:
            raise Unsupported(f"input {position} is {view.input(position).shape}, input 0 {shape}; "
                              "PACK needs equal shapes")
    same_quantization(view, [view.input(p) for p in positions], "PACK")
    axis = view.options.get("axis", 0)
    axis = axis + len(shape) + 1 if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise Unsupported(f"axis {view.options.get('axis', 0)} for inputs of rank {len(shape)}")
    _check_outputs(view, [shape[:axis] + (count,) + shape[axis:]])

    def run(*values: np.ndarray) -> np.ndarray:
        return pack(list(values), axis)

    return view.step_binding(run, *positions)


def unpack(input_data: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """reference_ops::Unpack: output i = input[..., i, ...] along `axis`, that dimension removed."""
    return tuple(np.array(input_data.take(i, axis=axis)) for i in range(input_data.shape[axis]))


def prepare_unpack(view: OpView) -> Step:
    source = view.input(0)
    count = view.options.get("num", 0)
    if count != len(view.operator.outputs):
        raise Unsupported(f"num {count} with {len(view.operator.outputs)} outputs (TFLite requires them equal)")
    same_type(view, (0,), UNPACK_TYPES)
    if not source.shape or int(np.prod(source.shape)) == 0:
        raise Unsupported(f"input {source.shape}: UNPACK needs a tensor with elements (TFLite's check)")
    axis = _normalized_axis(view.options.get("axis", 0), len(source.shape), "axis")
    if source.shape[axis] != count:
        raise Unsupported(f"num {count}, but dimension {axis} of {source.shape} is {source.shape[axis]}")
    outputs = [view.output(i) for i in range(count)]
    same_quantization(view, [source, *outputs], "UNPACK")
    _check_outputs(view, [source.shape[:axis] + source.shape[axis + 1:]] * count)

    def run(x: np.ndarray) -> tuple[np.ndarray, ...] | np.ndarray:
        parts = unpack(x, axis)
        return parts[0] if count == 1 else parts

    return view.step_binding(run, 0)


def split(input_data: np.ndarray, axis: int, size_splits: list[int]) -> tuple[np.ndarray, ...]:
    """reference_ops::Split: consecutive pieces of `axis`, size_splits[i] long each."""
    bounds = np.cumsum(size_splits)[:-1]
    return tuple(np.ascontiguousarray(part) for part in np.split(input_data, bounds, axis=axis))


def _constant_axis(view: OpView, position: int, rank: int) -> int:
    tensor = view.input(position)
    if tensor.type not in ("INT32", "INT64"):
        raise Unsupported(f"axis is {tensor.type}; expected INT32")
    values = np.asarray(view.constant(position, "axis")).reshape(-1)
    if values.size != 1:
        raise Unsupported(f"axis has {values.size} values; expected one")
    return _normalized_axis(int(values[0]), rank, "axis")


def _prepare_split(view: OpView, input_position: int, axis: int, size_splits: list[int]) -> Step:
    shape = view.input(input_position).shape
    _check_outputs(view, [shape[:axis] + (size,) + shape[axis + 1:] for size in size_splits])

    def run(x: np.ndarray) -> tuple[np.ndarray, ...] | np.ndarray:
        parts = split(x, axis, size_splits)
        return parts[0] if len(parts) == 1 else parts

    return view.step_binding(run, input_position)


def prepare_split(view: OpView) -> Step:
    """SPLIT: inputs (axis, input); num_splits equal pieces."""
    same_type(view, (1,), SPLIT_TYPES)
    shape = view.input(1).shape
    axis = _constant_axis(view, 0, len(shape))
    count = view.options.get("numSplits", 0)
    if count != len(view.operator.outputs) or count < 1:
        raise Unsupported(f"num_splits {count} with {len(view.operator.outputs)} outputs")
    if shape[axis] % count:
        raise Unsupported(f"dimension {axis} of {shape} does not split evenly in {count} (TFLite's check)")
    return _prepare_split(view, 1, axis, [shape[axis] // count] * count)


def prepare_split_v(view: OpView) -> Step:
    """SPLIT_V: inputs (input, size_splits, axis); one size may be -1, the rest of the dimension."""
    same_type(view, (0,), SPLIT_TYPES)
    shape = view.input(0).shape
    axis = _constant_axis(view, 2, len(shape))
    if view.input(1).type not in ("INT32", "INT64"):
        raise Unsupported(f"size_splits is {view.input(1).type}; expected INT32 or INT64")
    sizes = [int(s) for s in np.asarray(view.constant(1, "size_splits")).reshape(-1)]
    if len(sizes) != len(view.operator.outputs) or len(sizes) != view.options.get("numSplits", len(sizes)):
        raise Unsupported(f"{len(sizes)} size_splits for {len(view.operator.outputs)} outputs")
    if sizes.count(-1) > 1:
        raise Unsupported("size_splits contains more than one -1 (TFLite's check)")
    known = sum(s for s in sizes if s != -1)
    if -1 in sizes:
        if known > shape[axis]:
            raise Unsupported(f"size_splits {sizes} exceed dimension {axis} of {shape}")
        sizes[sizes.index(-1)] = shape[axis] - known
    if sum(sizes) != shape[axis] or min(sizes) < 0:
        raise Unsupported(f"size_splits {sizes} must sum to dimension {axis} of {shape}")
    return _prepare_split(view, 0, axis, sizes)


PREPARE = {
    "PACK": prepare_pack,
    "UNPACK": prepare_unpack,
    "SPLIT": prepare_split,
    "SPLIT_V": prepare_split_v,
}
