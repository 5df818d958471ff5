"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR on int8/uint8 and float32 NHWC (reference/resize_bilinear.h,
resize_nearest_neighbor.h). Source rows and columns are computed once at load; the run is two
gathers (nearest) or four gathers and a weighted sum (bilinear) over the whole tensor.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, c_divide
from app.emulator.kernels.common import OpView, Step, per_tensor, same_type

f32 = np.float32
# Measured on the pinned runtime (tests/test_emulator_resize.py).
RESIZE_BILINEAR_ROUNDING = Rounding.DOUBLE_ROUNDING
NEAREST_TYPES = ("INT8", "UINT8", "INT16", "INT32", "INT64", "FLOAT32")


def interpolation_values_integer(size_out: int, size_in: int, align_corners: bool, half_pixel_centers: bool):
    """ComputeInterpolationValuesInteger: positions in 1/1024 of a pixel, and the two source indices."""
    scale_10 = c_divide((1 << 10) * size_in + size_out // 2, size_out)
    if align_corners and size_out > 1:
        scale_10 = c_divide((1 << 10) * (size_in - 1) + (size_out - 1) // 2, size_out - 1)
    value = np.arange(size_out, dtype=np.int64)
    if half_pixel_centers:
        scaled = value * scale_10 + scale_10 // 2 - (1 << 9)
    else:
        scaled = value * scale_10
    lower = np.maximum(c_divide(scaled, 1 << 10), 0)
    upper = np.minimum(c_divide(scaled + (1 << 10) - 1, 1 << 10), size_in - 1)
    return scaled, lower, upper


def resize_bilinear_integer(input_data: np.ndarray, output_height: int, output_width: int, align_corners: bool,
                            half_pixel_centers: bool) -> np.ndarray:
    """reference_ops::ResizeBilinearInteger: 10-bit fixed-point weights, a 20-bit product, one rounding.

    The four terms x * wy * wx summed are (x[y0] * (1024 - dy) + x[y1] * dy) weighted by column: integer
    arithmetic, so the rows are blended first, at the input's width, then the columns (exact; every sum
    stays below 2^28 in int32)."""
    _, in_h, in_w, _ = input_data.shape
    input_y, y0, y1 = interpolation_values_integer(output_height, in_h, align_corners, half_pixel_centers)
    input_x, x0, x1 = interpolation_values_integer(output_width, in_w, align_corners, half_pixel_centers)
    dy = (input_y - (1 << 10) * y0).astype(np.int32)[None, :, None, None]
    dx = (input_x - (1 << 10) * x0).astype(np.int32)[None, None, :, None]
    x = input_data.astype(np.int32)
    rows = x[:, y0] * ((1 << 10) - dy) + x[:, y1] * dy  # [N, out_h, in_w, C], 10 fractional bits
    output_20 = np.take(rows, x0, axis=2)
    output_20 *= (1 << 10) - dx
    right = np.take(rows, x1, axis=2)
    right *= dx
    output_20 += right
    if RESIZE_BILINEAR_ROUNDING is Rounding.SINGLE_ROUNDING:
        interpolation = (output_20 + (1 << 19)) >> 20
    else:  # + or - 2^19, then a division by 2^20 truncating toward zero
        magnitude = (np.abs(output_20) + (1 << 19)) >> 20
        interpolation = np.where(output_20 > 0, magnitude, -magnitude)
    return interpolation.astype(input_data.dtype)


def interpolation_values(size_out: int, size_in: int, align_corners: bool, half_pixel_centers: bool):
    """ComputeInterpolationValues (float32): source position, floor and ceil, clamped to the image."""
    scale = f32(size_in) / f32(size_out)
    if align_corners and size_out > 1:
        scale = f32(size_in - 1) / f32(size_out - 1)
    value = np.arange(size_out, dtype=f32)
    if half_pixel_centers:
        scaled = ((value + f32(0.5)) * scale).astype(f32) - f32(0.5)
    else:
        scaled = (value * scale).astype(f32)
    lower = np.maximum(np.floor(scaled).astype(np.int64), 0)
    upper = np.minimum(np.ceil(scaled).astype(np.int64), size_in - 1)
    return scaled.astype(f32), lower, upper


def resize_bilinear_float(input_data: np.ndarray, output_height: int, output_width: int, align_corners: bool,
                          half_pixel_centers: bool) -> np.ndarray:
    """reference_ops::ResizeBilinear<T> (uint8 and float32): float32 weights, the four terms summed left to
    right, + rounding_offset (0.5f for an integer T, 0.0f for float: it turns -0.0 into +0.0) and a cast
    (truncating for an integer T).

    Each term is (x * wy) * wx in float32, in that order; x * wy does not depend on the output column, so it
    is computed once per output row at the input's width and gathered by column (the same floats)."""
    _, in_h, in_w, _ = input_data.shape
    input_y, y0, y1 = interpolation_values(output_height, in_h, align_corners, half_pixel_centers)
    input_x, x0, x1 = interpolation_values(output_width, in_w, align_corners, half_pixel_centers)
    dy = (input_y - y0.astype(f32)).astype(f32)[None, :, None, None]
    dx = (input_x - x0.astype(f32)).astype(f32)[None, None, :, None]
    one = f32(1)
    x = input_data.astype(f32)
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE results, infinities and NaN included, as in C++
        top, bottom = x[:, y0] * (one - dy), x[:, y1] * dy  # x * wy for rows y0 and y1: [N, out_h, in_w, C]
        total = np.take(top, x0, axis=2)
        total *= one - dx
        term = np.take(bottom, x0, axis=2)
        term *= one - dx
        total += term
        np.take(top, x1, axis=2, out=term)
        term *= dx
        total += term
        np.take(bottom, x1, axis=2, out=term)
        term *= dx
        total += term
    total += f32(0.0) if input_data.dtype == np.float32 else f32(0.5)
    return total.astype(input_data.dtype)


def _geometry(view: OpView):
    """Both resizes: the 4-D input shape, the constant output size (out_h, out_w), and the options."""
    shape, output = view.input(0).shape, view.output()
    if len(shape) != 4:
        raise Unsupported(f"input {shape}: expected 4-D NHWC")
    size = np.asarray(view.constant(1, "size")).reshape(-1).tolist()
    if size != list(output.shape[1:3]):
        raise Unsupported(f"size {size} differs from the output shape {output.shape}")
    return (shape, tuple(size), bool(view.options.get("alignCorners", False)),
            bool(view.options.get("halfPixelCenters", False)))


def prepare_resize_bilinear(view: OpView) -> Step:
    output = view.output()
    if view.input(0).type == "FLOAT32":
        dtype = np.dtype(np.float32)
    else:
        dtype, _, _ = per_tensor(view.input(0), "input")
    if output.type != view.input(0).type:
        raise Unsupported(f"input {view.input(0).type}, output {output.type}; expected the same type")
    shape, (out_h, out_w), align_corners, half_pixel_centers = _geometry(view)
    if align_corners and half_pixel_centers:
        raise Unsupported("align_corners and half_pixel_centers together (TFLite refuses it)")

    # measured: int8 takes ResizeBilinearInteger, uint8 and float32 the float template
    kernel = resize_bilinear_integer if dtype == np.int8 else resize_bilinear_float

    def run(x: np.ndarray) -> np.ndarray:
        return kernel(x, out_h, out_w, align_corners, half_pixel_centers)

    return view.step_binding(run, 0)


def nearest_neighbor_indices(size_out: int, size_in: int, align_corners: bool, half_pixel_centers: bool):
    """GetNearestNeighbor: (i + offset) * scale in float32, floored (or rounded with align_corners)."""
    if align_corners and size_out > 1:
        scale = f32(size_in - 1) / f32(size_out - 1)
    else:
        scale = f32(size_in) / f32(size_out)
    offset = f32(0.5) if half_pixel_centers else f32(0.0)
    position = ((np.arange(size_out, dtype=f32) + offset) * f32(scale)).astype(f32)
    if align_corners:
        index = np.copysign(np.floor(np.abs(position) + f32(0.5)), position).astype(np.int64)
    else:
        index = np.floor(position).astype(np.int64)
    index = np.minimum(index, size_in - 1)
    if half_pixel_centers:
        index = np.maximum(index, 0)
    return index


def prepare_resize_nearest_neighbor(view: OpView) -> Step:
    """Values copied, whatever the type: the 8-bit ones of detectors' FPNs, float32 and int32 in float tails."""
    same_type(view, (0,), NEAREST_TYPES)
    shape, size, align_corners, half_pixel_centers = _geometry(view)
    rows = nearest_neighbor_indices(size[0], shape[1], align_corners, half_pixel_centers)
    columns = nearest_neighbor_indices(size[1], shape[2], align_corners, half_pixel_centers)

    def run(x: np.ndarray) -> np.ndarray:
        """reference_ops::ResizeNearestNeighbor."""
        return x[:, rows][:, :, columns]

    return view.step_binding(run, 0)


PREPARE = {"RESIZE_BILINEAR": prepare_resize_bilinear, "RESIZE_NEAREST_NEIGHBOR": prepare_resize_nearest_neighbor}
