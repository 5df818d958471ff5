"""MEAN and SUM over constant axes, int8 and uint8, as kernels/reduce.cc dispatches them.

Older TFLite versions dispatched MEAN to several kernels by shape and quantization (a float
path among them); measured on the pinned runtime, every 8-bit MEAN and SUM goes through
QuantizedMeanOrSum: an integer sum, the zero point removed, one requantization with the count
folded into the multiplier for a mean. SUM has a twist, see prepare_sum.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier, quantize_multiplier
from app.emulator.kernels.common import OpView, Step, per_tensor, type_range

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


def prepare_mean(view: OpView) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    axes, keep_dims = _axes(view)
    output_shape = view.output().shape
    multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))
    count = int(np.prod([view.input(0).shape[a] for a in axes]))
    low, high = type_range(input_dtype)
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
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    axes, keep_dims = _axes(view)
    output_shape = view.output().shape
    multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))

    def run(x):
        total = quantized_mean_or_sum(x.view(np.uint8), input_zero_point, multiplier, shift, output_zero_point, axes,
                                      keep_dims, True, np.dtype(np.uint8))
        return total.astype(np.uint8).view(output_dtype).reshape(output_shape)

    return view.step(run, 0)


PREPARE = {"MEAN": prepare_mean, "SUM": prepare_sum}
