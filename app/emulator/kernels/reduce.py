"""MEAN and SUM over constant axes, int8 and uint8, as kernels/reduce.cc dispatches them; ARG_MAX and
ARG_MIN (kernels/arg_min_max.cc) over a constant axis, on 8-bit, int32, float32 and bool values.

Older TFLite versions dispatched MEAN to several kernels by shape and quantization (a float
path among them); measured on the pinned runtime, every 8-bit MEAN and SUM goes through
QuantizedMeanOrSum: an integer sum, the zero point removed, one requantization with the count
folded into the multiplier for a mean. SUM has a twist, see prepare_sum.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier, quantize_multiplier
from app.emulator.kernels.common import OpView, Step, per_tensor, tensor_type, type_range

# Measured on the pinned runtime (tests/test_emulator_reduce.py).
MEAN_ROUNDING = Rounding.DOUBLE_ROUNDING
# A MEAN over at most this many possible sums runs as a look-up table built at load (a 7x7 global
# average pool of 8-bit values has 12496); larger reductions requantize their sums at run time.
SUM_TABLE_LIMIT = 2**20


def quantized_mean_or_sum(input_data: np.ndarray, input_zero_point: int, output_multiplier: int, output_shift: int,
                          output_zero_point: int, axes: tuple[int, ...], keep_dims: bool, compute_sum: bool,
                          output_dtype: np.dtype) -> np.ndarray:
    """reference_ops::QuantizedMeanOrSum: integer sum, then one requantization.

    For a mean the count joins the multiplier: (multiplier << shift) / count in C, shift being
    floor(log2(count)) capped at 32 and at 31 + output_shift; the sum's zero point is removed first.
    """
    count = int(np.prod([input_data.shape[a] for a in axes]))
    temp_sum = input_data.astype(np.int64).sum(axis=axes, keepdims=keep_dims)
    return requantize_sum(temp_sum, count, input_zero_point, output_multiplier, output_shift, output_zero_point,
                          compute_sum, output_dtype)


def requantize_sum(temp_sum: np.ndarray, count: int, input_zero_point: int, output_multiplier: int,
                   output_shift: int, output_zero_point: int, compute_sum: bool, output_dtype: np.dtype) -> np.ndarray:
    """The second half of QuantizedMeanOrSum: the integer sums of `count` values -> output values."""
    if not compute_sum:
        shift = min(count.bit_length() - 1, 32, 31 + output_shift)
        output_multiplier = (output_multiplier << shift) // count
        output_shift = output_shift - shift
    shifted_sum = temp_sum - input_zero_point * count
    output = multiply_by_quantized_multiplier(shifted_sum, output_multiplier, output_shift, MEAN_ROUNDING)
    low, high = type_range(output_dtype)
    return np.clip(output + output_zero_point, low, high)


def _axes(view: OpView) -> tuple[tuple[int, ...], bool]:
    rank = len(view.input(0).shape)
    raw = np.asarray(view.constant(1, "axis")).reshape(-1)
    axes = []
    for axis in raw.tolist():
        if not -rank <= axis < rank:
            raise Unsupported(f"axis {axis} is out of range for a rank-{rank} input")
        axis = axis + rank if axis < 0 else axis
        if axis not in axes:
            axes.append(axis)
    return tuple(axes), bool(view.options.get("keepDims", False))


def _reduction(view: OpView) -> tuple[np.dtype, int, int, int, int, tuple[int, ...], bool]:
    """What MEAN and SUM prepare alike (reduce.cc's Prepare): the 8-bit type (the input's and the output's), both
    zero points, the multiplier and shift of input_scale / output_scale, the axes and keep_dims."""
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))
    return (output_dtype, input_zero_point, output_zero_point, multiplier, shift, *_axes(view))


def prepare_mean(view: OpView) -> Step:
    output_dtype, input_zero_point, output_zero_point, multiplier, shift, axes, keep_dims = _reduction(view)
    output_shape = view.output().shape
    count = int(np.prod([view.input(0).shape[a] for a in axes]))
    low, high = type_range(output_dtype)  # the input's too
    if count * (high - low) < SUM_TABLE_LIMIT:
        # every sum the input can have, requantized once at load: the run is a sum and a look-up
        sums = np.arange(count * low, count * high + 1, dtype=np.int64)
        table = requantize_sum(sums, count, input_zero_point, multiplier, shift, output_zero_point, False,
                               output_dtype).astype(output_dtype)

        def run_table(x):
            total = x.sum(axis=axes, keepdims=keep_dims, dtype=np.int64)
            return table.take(total - count * low).reshape(output_shape)

        return view.step(run_table, 0)

    def run(x):
        return quantized_mean_or_sum(x, input_zero_point, multiplier, shift, output_zero_point, axes, keep_dims,
                                     False, output_dtype).astype(output_dtype).reshape(output_shape)

    return view.step(run, 0)


def prepare_sum(view: OpView) -> Step:
    """SUM: QuantizedMeanOrSum without the count, on unsigned bytes.

    Measured on the pinned runtime: an int8 SUM is computed by the uint8 kernel on the same
    bytes (values read unsigned, the int8 zero points used as they are, the result clamped to
    [0, 255] and stored as a byte): [-1, -1, -1] with zero point 0 sums to -1, not -3. It is
    deterministic, so it is reproduced as such; a uint8 SUM is the plain case of the same code.
    """
    output_dtype, input_zero_point, output_zero_point, multiplier, shift, axes, keep_dims = _reduction(view)
    output_shape = view.output().shape

    def run(x):
        total = quantized_mean_or_sum(x.view(np.uint8), input_zero_point, multiplier, shift, output_zero_point, axes,
                                      keep_dims, True, np.dtype(np.uint8))
        return total.astype(np.uint8).view(output_dtype).reshape(output_shape)

    return view.step(run, 0)


INT32_MAX = 2**31 - 1


def _nan_aware_update(value, index, candidate, candidate_index, is_arg_max: bool):
    """ArgMaxVector's (ArgMinVector's) update: a candidate that is a number replaces the value held when that
    is NaN or the candidate compares greater (less)."""
    better = candidate > value if is_arg_max else candidate < value
    take = ~np.isnan(candidate) & (np.isnan(value) | better)
    return np.where(take, candidate, value), np.where(take, candidate_index, index)


def arg_min_max_vector(values: np.ndarray, is_arg_max: bool) -> np.ndarray:
    """optimized_ops::ArgMaxVector / ArgMinVector<float> per row of [R, size] (the last-axis kernel).

    Without NaN: the first index of the extreme, np.argmax / np.argmin. With NaN, x86 runs the NEON code
    through NEON_2_SSE, followed step by step: 4 lanes updated NaN-aware a block at a time, then a pairwise
    horizontal extreme as NEON_2_SSE computes it (vpmax_f32: `a < b ? b : a`; vpmin_f32: `a > b ? b : a`,
    where a NaN in the first operand survives), the lowest lane index holding it, then a NaN-aware scalar
    loop over the rest; 0 when the value ends NaN (measured on the pinned runtime: [NaN, 1, 2, 0] gives 0,
    [NaN, -inf] gives 1)."""
    rows, size = values.shape
    choose = np.argmax if is_arg_max else np.argmin
    if not np.isnan(values).any():
        return choose(values, axis=1)
    if size >= 4:
        lanes, lane_index = values[:, :4].copy(), np.broadcast_to(np.arange(4), (rows, 4)).copy()
        end = 4 * (size // 4)
        for i in range(4, end, 4):
            lanes, lane_index = _nan_aware_update(lanes, lane_index, values[:, i:i + 4], np.arange(i, i + 4),
                                                  is_arg_max)
        l0, l1, l2, l3 = lanes.T
        if is_arg_max:
            a, b = np.where(l0 < l1, l1, l0), np.where(l2 < l3, l3, l2)
            value = np.where(a < b, b, a)
        else:
            a, b = np.where(l0 > l1, l1, l0), np.where(l2 > l3, l3, l2)
            value = np.where(a > b, b, a)
        index = np.where(lanes == value[:, None], lane_index, INT32_MAX).min(axis=1)
        start = end
    else:
        value, index, start = values[:, 0].copy(), np.zeros(rows, np.int64), 1
    for i in range(start, size):
        value, index = _nan_aware_update(value, index, values[:, i], i, is_arg_max)
    return np.where(np.isnan(value), 0, index)


def arg_min_max(input_data: np.ndarray, axis: int, is_arg_max: bool, output_dtype: np.dtype) -> np.ndarray:
    """optimized_ops::ArgMinMax: the first index of the largest (smallest) value; equal values keep the first.

    Where nothing follows the axis (inner size 1) and the values are float32, int8 or uint8, it runs the
    last-axis kernel (arg_min_max_vector for floats: NaN as its NEON-on-SSE code treats it). Elsewhere
    reference_ops::ArgMinMax's loop, whose float comparison is NaN-aware: a NaN never wins and any number
    replaces a NaN held, so the answer is the first extreme among the numbers (0 when all are NaN)."""
    values = np.moveaxis(np.asarray(input_data), axis, -1)
    choose = np.argmax if is_arg_max else np.argmin
    if values.dtype.kind != "f":
        return np.asarray(choose(values, axis=-1), output_dtype)
    if int(np.prod(input_data.shape[axis + 1:], dtype=np.int64)) == 1:
        rows = values.reshape(-1, values.shape[-1])
        return np.asarray(arg_min_max_vector(rows, is_arg_max), output_dtype).reshape(values.shape[:-1])
    numbers = ~np.isnan(values)
    filled = np.where(numbers, values, -np.inf if is_arg_max else np.inf)
    extreme = (np.max if is_arg_max else np.min)(filled, axis=-1, keepdims=True)
    return np.asarray(np.argmax(numbers & (values == extreme), axis=-1), output_dtype)  # all NaN: 0


ARG_MIN_MAX_INPUTS = ("FLOAT32", "UINT8", "INT8", "INT32", "BOOL")


def _prepare_arg_min_max(view: OpView, is_arg_max: bool) -> Step:
    source = view.input(0)
    tensor_type(source, "input", ARG_MIN_MAX_INPUTS)
    output_dtype = tensor_type(view.output(), "output", ("INT32", "INT64"))
    if view.input(1).type not in ("INT32", "INT64"):
        raise Unsupported(f"axis is {view.input(1).type}; expected INT32 or INT64")
    axis_values = np.asarray(view.constant(1, "axis")).reshape(-1)  # a computed axis makes the output dynamic
    if axis_values.size != 1:
        raise Unsupported(f"axis has {axis_values.size} values; expected one")
    rank = len(source.shape)
    axis = int(axis_values[0])
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or source.shape[axis] < 1:
        raise Unsupported(f"axis {int(axis_values[0])} of input {source.shape}")
    output_shape = source.shape[:axis] + source.shape[axis + 1:]
    if output_shape != view.output().shape:
        raise Unsupported(f"the kernel gives {output_shape}; output {view.output().shape}")

    def run(x: np.ndarray) -> np.ndarray:
        return arg_min_max(x, axis, is_arg_max, output_dtype)

    return view.step_binding(run, 0)


def prepare_arg_max(view: OpView) -> Step:
    return _prepare_arg_min_max(view, is_arg_max=True)


def prepare_arg_min(view: OpView) -> Step:
    return _prepare_arg_min_max(view, is_arg_max=False)


PREPARE = {"MEAN": prepare_mean, "SUM": prepare_sum, "ARG_MAX": prepare_arg_max, "ARG_MIN": prepare_arg_min}
