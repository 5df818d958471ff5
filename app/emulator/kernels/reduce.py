"""MEAN and SUM over constant axes, int8 and uint8, as kernels/reduce.cc dispatches them.

TFLite picks one of several kernels by shape and quantization, and they round differently:
- MEAN, keep_dims, 4-D, axes {1, 2}: reference_integer_ops::Mean (int8: integer multiplier, then
  a rounded division by the count) or reference_ops::Mean for uint8 (multiplier includes the count);
- MEAN with the input's scale and zero point on the output: integer sum, C division (truncating);
- otherwise QuantizedMeanOrSum: an integer sum and one requantization, the count folded into
  the multiplier (the pinned runtime's version; older ones computed this in float);
- SUM with equal quantization: a plain sum of the raw values in the 8-bit type (it wraps);
- SUM otherwise: QuantizedMeanOrSum without the count.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier, quantize_multiplier
from app.emulator.kernels.common import OpView, Step, per_tensor, type_range

# Measured on the pinned runtime (tests/test_emulator_reduce.py).
MEAN_ROUNDING = Rounding.DOUBLE_ROUNDING


def _c_divide(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """C integer division: truncates toward zero (numpy // floors)."""
    quotient = np.abs(numerator) // denominator
    return np.where(numerator < 0, -quotient, quotient)


def mean_4d_int8(input_data: np.ndarray, multiplier: int, shift: int, input_zero_point: int,
                 output_zero_point: int) -> np.ndarray:
    """reference_integer_ops::Mean: NHWC over H and W, keep_dims."""
    _, height, width, _ = input_data.shape
    num_elements_in_axis = height * width
    acc = (input_data.astype(np.int64) - input_zero_point).sum(axis=(1, 2), keepdims=True)
    acc = multiply_by_quantized_multiplier(acc, multiplier, shift, MEAN_ROUNDING)
    half = num_elements_in_axis // 2
    acc = np.where(acc > 0, _c_divide(acc + half, num_elements_in_axis), _c_divide(acc - half, num_elements_in_axis))
    return np.clip(acc + output_zero_point, -128, 127)


def mean_4d_uint8(input_data: np.ndarray, input_zero_point: int, input_scale: float, output_zero_point: int,
                  output_scale: float) -> np.ndarray:
    """reference_ops::Mean (uint8): the count folded into the multiplier, the zero points into a bias."""
    _, height, width, _ = input_data.shape
    num_elements_in_axis = np.float32(height * width)
    f32 = np.float32
    bias = output_zero_point - int(np.trunc(f32(f32(input_zero_point) * f32(input_scale)) / f32(output_scale)))
    real_scale = float(f32(f32(input_scale) / f32(num_elements_in_axis * f32(output_scale))))
    multiplier, shift = quantize_multiplier(real_scale)
    acc = input_data.astype(np.int64).sum(axis=(1, 2), keepdims=True)
    acc = multiply_by_quantized_multiplier(acc, multiplier, shift, MEAN_ROUNDING) + bias
    return np.clip(acc, 0, 255)


def mean_same_quantization(input_data: np.ndarray, axes: tuple[int, ...], keep_dims: bool) -> np.ndarray:
    """reference_ops::Mean<T, int>: sum of the raw values, divided by the count in C (truncating)."""
    count = int(np.prod([input_data.shape[a] for a in axes]))
    total = input_data.astype(np.int64).sum(axis=axes, keepdims=keep_dims)
    return _c_divide(total, count)


def quantized_mean_or_sum(input_data: np.ndarray, input_zero_point: int, output_multiplier: int, output_shift: int,
                          output_zero_point: int, axes: tuple[int, ...], keep_dims: bool, compute_sum: bool,
                          output_dtype: np.dtype) -> np.ndarray:
    """reference_ops::QuantizedMeanOrSum: integer sum, then one requantization.

    For a mean the count joins the multiplier: (multiplier << shift) / count in C, shift being
    floor(log2(count)) capped at 32 and at 31 + output_shift; the sum's zero point is removed first.
    """
    count = int(np.prod([input_data.shape[a] for a in axes]))
    temp_sum = input_data.astype(np.int64).sum(axis=axes, keepdims=keep_dims)
    if not compute_sum:
        shift = min(count.bit_length() - 1, 32, 31 + output_shift)
        output_multiplier = (output_multiplier << shift) // count
        output_shift = output_shift - shift
    shifted_sum = temp_sum - input_zero_point * count
    output = multiply_by_quantized_multiplier(shifted_sum, output_multiplier, output_shift, MEAN_ROUNDING)
    low, high = type_range(output_dtype)
    return np.clip(output + output_zero_point, low, high)


def reduce_sum_same_quantization(input_data: np.ndarray, axes: tuple[int, ...], keep_dims: bool) -> np.ndarray:
    """reference_ops::ReduceGeneric with +: accumulates in the 8-bit type itself, wrapping."""
    return input_data.astype(np.int64).sum(axis=axes, keepdims=keep_dims).astype(input_data.dtype)


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


def prepare_mean(view: OpView) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    axes, keep_dims = _axes(view)
    raw_axes = tuple(np.asarray(view.constant(1, "axis")).reshape(-1).tolist())
    rank = len(view.input(0).shape)
    output_shape = view.output().shape
    if keep_dims and rank == 4 and raw_axes in ((1, 2), (2, 1)):
        if input_dtype == np.int8:
            multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))

            def run(x):
                return mean_4d_int8(x, multiplier, shift, input_zero_point, output_zero_point).astype(np.int8)
        else:
            def run(x):
                return mean_4d_uint8(x, input_zero_point, input_scale, output_zero_point,
                                     output_scale).astype(np.uint8)
    elif (input_scale, input_zero_point) == (output_scale, output_zero_point):
        def run(x):
            return mean_same_quantization(x, axes, keep_dims).astype(output_dtype).reshape(output_shape)
    else:
        multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))

        def run(x):
            return quantized_mean_or_sum(x, input_zero_point, multiplier, shift, output_zero_point, axes, keep_dims,
                                         False, output_dtype).astype(output_dtype).reshape(output_shape)
    return view.step(run, 0)


def prepare_sum(view: OpView) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    axes, keep_dims = _axes(view)
    output_shape = view.output().shape
    if (input_scale, input_zero_point) == (output_scale, output_zero_point):
        def run(x):
            return reduce_sum_same_quantization(x, axes, keep_dims).reshape(output_shape)
    else:
        multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))

        def run(x):
            return quantized_mean_or_sum(x, input_zero_point, multiplier, shift, output_zero_point, axes, keep_dims,
                                         True, output_dtype).astype(output_dtype).reshape(output_shape)
    return view.step(run, 0)


PREPARE = {"MEAN": prepare_mean, "SUM": prepare_sum}
