"""MAX_POOL_2D and AVERAGE_POOL_2D on int8/uint8 NHWC (reference/integer_ops/pooling.h, reference/pooling.h).

Windows are visited one filter tap at a time over the whole tensor (a vectorised pass per tap).
Taps outside the image are skipped in TFLite: here they are padded with a value that cannot
win a max, and with zeros (and a zero count) for the average.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import c_divide
from app.emulator.kernels.common import (
    OpView,
    Padding,
    Step,
    activation_range,
    compute_padding,
    pad_spatial,
    per_tensor,
    tap_view,
)


def max_pool(input_data: np.ndarray, padding: Padding, filter_height: int, filter_width: int, stride_height: int,
             stride_width: int, quantized_activation_min: int, quantized_activation_max: int) -> np.ndarray:
    """reference_integer_ops::MaxPool: max over in-image taps, then the activation clamp."""
    lowest = np.iinfo(input_data.dtype).min
    padded = pad_spatial(input_data, padding, lowest, input_data.dtype)
    result = None
    for i in range(filter_height):
        for j in range(filter_width):
            view = tap_view(padded, i, j, padding, stride_height, stride_width, 1, 1)
            result = view.copy() if result is None else np.maximum(result, view, out=result)
    return np.clip(result, quantized_activation_min, quantized_activation_max).astype(input_data.dtype)


# Fixed: filters with more taps than this sum their windows in one pass each (a handful of windows: DeepLab's
# image pooling averages its whole 33x33 or 65x65 feature map into one) or from an integral image, instead of
# one vectorised pass per tap (1089-4225 of them). Integer sums either way, so the results are the same.
INTEGRAL_IMAGE_TAPS = 16
FEW_WINDOWS = 16


def window_sums(padded: np.ndarray, padding: Padding, filter_height: int, filter_width: int, stride_height: int,
                stride_width: int) -> np.ndarray:
    """Sum of each pooling window of a padded NHWC array (int64: exact): window by window when there are few,
    else from the array's integral image (two cumulative sums, four reads per window)."""
    n, h, w, c = padded.shape
    if padding.output_height * padding.output_width <= FEW_WINDOWS:
        sums = [padded[:, y * stride_height:y * stride_height + filter_height,
                       x * stride_width:x * stride_width + filter_width].sum(axis=(1, 2), dtype=np.int64)
                for y in range(padding.output_height) for x in range(padding.output_width)]
        return np.stack(sums, axis=1).reshape(n, padding.output_height, padding.output_width, c)
    integral = np.zeros((n, h + 1, w + 1, c), np.int64)
    np.cumsum(np.cumsum(padded, axis=1, dtype=np.int64), axis=2, out=integral[:, 1:, 1:])
    top = np.arange(padding.output_height) * stride_height
    left = np.arange(padding.output_width) * stride_width
    bottom, right = top + filter_height, left + filter_width
    rows_top, rows_bottom = integral[:, top], integral[:, bottom]
    return (rows_bottom[:, :, right] - rows_top[:, :, right]) - (rows_bottom[:, :, left] - rows_top[:, :, left])


def average_pool(input_data: np.ndarray, padding: Padding, filter_height: int, filter_width: int,
                 stride_height: int, stride_width: int, quantized_activation_min: int,
                 quantized_activation_max: int) -> np.ndarray:
    """reference_integer_ops::AveragePool: sum and count of in-image taps, rounded division, clamp.

    int8 rounds half away from zero, (acc +- count / 2) / count in C; uint8 sums are never negative.
    """
    padded = pad_spatial(input_data, padding, 0, np.int32)
    inside = pad_spatial(np.ones(input_data.shape[:3] + (1,), np.int32), padding, 0, np.int32)
    if filter_height * filter_width > INTEGRAL_IMAGE_TAPS:
        acc = window_sums(padded, padding, filter_height, filter_width, stride_height, stride_width)
        count = window_sums(inside, padding, filter_height, filter_width, stride_height, stride_width)
    else:
        acc = count = None
        for i in range(filter_height):
            for j in range(filter_width):
                view = tap_view(padded, i, j, padding, stride_height, stride_width, 1, 1)
                taps = tap_view(inside, i, j, padding, stride_height, stride_width, 1, 1)
                acc = view.copy() if acc is None else np.add(acc, view, out=acc)
                count = taps.copy() if count is None else np.add(count, taps, out=count)
    acc = acc.astype(np.int64)
    count = count.astype(np.int64)
    half = count // 2
    acc = np.where(acc > 0, c_divide(acc + half, count), c_divide(acc - half, count))
    return np.clip(acc, quantized_activation_min, quantized_activation_max).astype(input_data.dtype)


def _prepare_pool(view: OpView, kernel) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    shape = view.input(0).shape
    if len(shape) != 4:
        raise Unsupported(f"input {shape}: expected 4-D NHWC")
    o = view.options
    filter_h, filter_w = o.get("filterHeight", 1), o.get("filterWidth", 1)
    stride_h, stride_w = o.get("strideH", 1), o.get("strideW", 1)
    padding = compute_padding(o.get("padding", 0), shape[1], shape[2], filter_h, filter_w, stride_h, stride_w)
    act_min, act_max = activation_range(o.get("fusedActivationFunction", 0), view.output())

    def run(x: np.ndarray) -> np.ndarray:
        return kernel(x, padding, filter_h, filter_w, stride_h, stride_w, act_min, act_max)

    return view.step(run, 0)


def prepare_max_pool_2d(view: OpView) -> Step:
    return _prepare_pool(view, max_pool)


def prepare_average_pool_2d(view: OpView) -> Step:
    return _prepare_pool(view, average_pool)


PREPARE = {"MAX_POOL_2D": prepare_max_pool_2d, "AVERAGE_POOL_2D": prepare_average_pool_2d}
