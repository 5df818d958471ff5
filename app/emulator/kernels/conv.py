"""CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV: the convolutions (FULLY_CONNECTED and BATCH_MATMUL: matmul.py).

TFLite (reference/integer_ops/conv.h, depthwise_conv.h; reference/conv.h for uint8) accumulates filter * (input + input_offset) over in-image taps only, adds the bias,
requantizes per output channel, adds the output offset and clamps. Here:

- accumulate: out-of-image taps are skipped in TFLite, which equals padding the input with its
  zero point; so the input is padded with its zero point and the input offset is folded into
  the bias once at load (sum over taps of (x - zp) * w = sum x * w - zp * sum w). Products of
  8-bit values are float: float32 where every partial sum is provably below 2^24 (|sum| <=
  sum |w| * max |x|, per output channel, decided at load), float64 otherwise. CONV_2D is a BLAS
  matrix product (im2col for filters larger than 1x1);
  DEPTHWISE_CONV_2D is one einsum per stride phase over strided views of the input (PhaseGrid),
  or one numba pass (app/emulator/accel.py) when installed.
- +bias, requantize, +output offset, clamp: one Requantizer, exact by construction (requantize.py).

TRANSPOSE_CONV (reference_integer_ops::TransposeConv, reference_ops::TransposeConv for uint8) is
not on the hot path of any model here (a CPU-side op of partially mapped models): it runs in
plain numpy, no numba and no Requantizer, accumulating in float64 (exact: every sum of 8-bit
products is far below 2^53) and requantizing with fixedpoint.multiply_by_quantized_multiplier.

The numpy kernels run block by block of output rows (BLOCK_VALUES), accumulating and then
requantizing each block while its temporaries (in the interpreter's Scratch) are in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from app.emulator.errors import Unsupported
from app.emulator.kernels.common import (
    OpView,
    Padding,
    Step,
    activation_range,
    compute_padding,
    multipliers,
    pad_spatial,
    per_tensor,
    quantized_type,
    scale_of,
    type_range,
    zero_point_of,
)
from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier
from app.emulator.requantize import FLOAT32_EXACT_INTEGERS, Requantizer, RequantParams
from app.emulator.scratch import Scratch

# Measured on the pinned runtime (tests/test_emulator_rounding.py): the convolutions (transposed too) round twice.
CONV_ROUNDING = Rounding.DOUBLE_ROUNDING
TRANSPOSE_CONV_ROUNDING = Rounding.DOUBLE_ROUNDING

INT32_TYPES = ("INT32",)
# Values per block of output rows in the matrix kernels: the block's patches, accumulators and
# their float64 and integer copies in requantization stay in the (L2 + L3) cache between passes,
# where whole layers (up to 1.2 M values here) went through memory at each pass. Smaller blocks
# pay more in per-call overhead than they gain: 2^18 measured best on EfficientNet-Lite0.
BLOCK_VALUES = 2**18


def conv_2d(input_data: np.ndarray, filter_matrix: np.ndarray, input_zero_point: int, padding: Padding,
            filter_height: int, filter_width: int, stride_height: int, stride_width: int,
            dilation_height_factor: int, dilation_width_factor: int, requantize: Requantizer,
            scratch: Scratch) -> np.ndarray:
    """reference_integer_ops::ConvPerChannel (int8) and reference_ops::Conv (uint8), NHWC.

    filter_matrix: [filter_height * filter_width * input_depth, output_depth], filter offset applied.
    A block of output rows at a time: its patches (im2col: one copy from a strided view of the
    padded input, 8-bit values to float), one BLAS product, its requantization, all within the cache.
    """
    batches, _, _, depth = input_data.shape
    output_height, output_width, output_depth = padding.output_height, padding.output_width, filter_matrix.shape[1]
    taps = filter_height * filter_width
    if taps == 1 and stride_height == stride_width == 1:  # pointwise, never padded: the input is the patches
        windows = input_data.reshape(batches, output_height, output_width, 1, 1, depth)
    else:
        padded = pad_spatial(input_data, padding, input_zero_point, input_data.dtype)
        n_stride, y_stride, x_stride, c_stride = padded.strides
        windows = as_strided(padded, (batches, output_height, output_width, filter_height, filter_width, depth),
                             (n_stride, stride_height * y_stride, stride_width * x_stride,
                              dilation_height_factor * y_stride, dilation_width_factor * x_stride, c_stride),
                             writeable=False)  # [n, y, x, i, j, c]
    output = np.empty((batches, output_height, output_width, output_depth), requantize.params.output_dtype)
    for n in range(batches):
        for y0, y1 in row_blocks(output_height, output_width * output_depth):
            rows = (y1 - y0) * output_width
            patches = scratch.array("conv.patches", (y1 - y0, output_width, filter_height, filter_width, depth),
                                    filter_matrix.dtype)
            np.copyto(patches, windows[n, y0:y1])
            acc = scratch.array("conv.acc", (rows, output_depth), filter_matrix.dtype)
            np.matmul(patches.reshape(rows, taps * depth), filter_matrix, out=acc)  # accumulate (offset in the bias)
            requantize(acc, output[n, y0:y1].reshape(rows, output_depth))  # +bias, requantize, +output offset, clamp
    return output


def row_blocks(height: int, row_size: int) -> list[tuple[int, int]]:
    """Output rows [y0, y1) in blocks of at most about BLOCK_VALUES values (at least one row), evenly split."""
    blocks = min(height, -(-height * row_size // BLOCK_VALUES))
    return [(k * height // blocks, (k + 1) * height // blocks) for k in range(blocks)]


@dataclass(frozen=True)
class PhaseWindow:
    """The taps that read one phase array: a regular grid of offsets there (rows x columns of taps)."""

    phase: int
    row: int           # first tap's offset, in phase rows
    row_step: int
    rows: int
    column: int        # first tap's offset, in phase columns
    column_step: int
    columns: int
    taps: tuple[int, ...]  # tap indices (i * filter_width + j), row-major over this grid


@dataclass(frozen=True)
class PhaseGrid:
    """Where a strided, dilated depthwise filter reads, as stride-1 offsets into stride-phase arrays.

    Phase (a, b) holds the padded input's rows a, a + s, ... and columns b, b + s, ...; tap (i, j)
    reads phase (i*d % s, j*d % s) shifted by (i*d // s, j*d // s). Each phase is kept flat, with
    `columns` per row: a tap is then one contiguous slice, and a pass over it runs along whole rows
    (output columns past the real width are computed and dropped). The taps of one phase form a
    regular grid (a PhaseWindow), so all of them are one strided view of that phase.
    """

    rows: int                  # rows allocated per phase (slack for the last taps' slices)
    columns: int               # columns per phase row
    phases: tuple[tuple[int, int], ...]  # (row phase, column phase) of each phase array
    phase_of_tap: np.ndarray   # int64 [taps]: which phase array each tap reads
    offset_of_tap: np.ndarray  # int64 [taps]: its flat offset there, in pixels
    windows: tuple[PhaseWindow, ...]

    @classmethod
    def of(cls, padding: Padding, padded_height: int, padded_width: int, filter_height: int, filter_width: int,
           stride_height: int, stride_width: int, dilation_height: int, dilation_width: int) -> PhaseGrid:
        columns = -(-padded_width // stride_width)
        phases, phase_of_tap, offset_of_tap, deepest = [], [], [], 0
        for i in range(filter_height):
            for j in range(filter_width):
                y, x = i * dilation_height, j * dilation_width
                phase = (y % stride_height, x % stride_width)
                if phase not in phases:
                    phases.append(phase)
                phase_of_tap.append(phases.index(phase))
                offset_of_tap.append((y // stride_height) * columns + x // stride_width)
                deepest = max(deepest, y // stride_height)
        rows = max(-(-padded_height // stride_height), deepest + padding.output_height + 1)
        windows = []
        for p, (a, b) in enumerate(phases):
            tap_rows = [i for i in range(filter_height) if i * dilation_height % stride_height == a]
            tap_columns = [j for j in range(filter_width) if j * dilation_width % stride_width == b]
            row_offsets = [i * dilation_height // stride_height for i in tap_rows]
            column_offsets = [j * dilation_width // stride_width for j in tap_columns]
            windows.append(PhaseWindow(
                p, row_offsets[0], row_offsets[1] - row_offsets[0] if len(row_offsets) > 1 else 1, len(row_offsets),
                column_offsets[0], column_offsets[1] - column_offsets[0] if len(column_offsets) > 1 else 1,
                len(column_offsets), tuple(i * filter_width + j for i in tap_rows for j in tap_columns)))
        return cls(rows, columns, tuple(phases), np.array(phase_of_tap, np.int64), np.array(offset_of_tap, np.int64),
                   tuple(windows))


def depthwise_conv_2d(input_data: np.ndarray, window_weights: tuple[np.ndarray, ...], input_zero_point: int,
                      padding: Padding, depth_multiplier: int, stride_height: int, stride_width: int, grid: PhaseGrid,
                      requantize: Requantizer, scratch: Scratch) -> np.ndarray:
    """reference_integer_ops::DepthwiseConvPerChannel (int8) and reference_ops::DepthwiseConv (uint8).

    Output channel ic * depth_multiplier + m reads input channel ic. Per block of output rows and
    per stride phase, one einsum over a strided view of all that phase's taps (products summed in
    the loop, no temporaries, only the output's own columns), then the block's requantization,
    within the cache. None per pixel or channel.
    window_weights: per PhaseWindow, [rows, columns, output_width * output_depth], each tap's
    weights repeated along an output row.
    """
    source = input_data if depth_multiplier == 1 else np.repeat(input_data, depth_multiplier, axis=3)
    batches, _, _, channels = source.shape
    sums = window_weights[0].dtype
    phases = _phase_stack(source, input_zero_point, padding, stride_height, stride_width, grid, sums, scratch)
    output_height, output_width = padding.output_height, padding.output_width
    row = grid.columns * channels  # a phase row
    width = output_width * channels  # an output row: what each tap's view spans of a phase row
    item = phases.itemsize
    output = np.empty((batches, output_height, width), requantize.params.output_dtype)
    for n in range(batches):
        # every tap of a phase at once: [output rows, tap rows, tap columns, width], no copy
        views = [np.ndarray((output_height, window.rows, window.columns, width), sums, phases,
                            (window.phase * batches + n) * phases.shape[2] * item
                            + (window.row * grid.columns + window.column) * channels * item,
                            (row * item, window.row_step * row * item, window.column_step * channels * item, item))
                 for window in grid.windows]
        for y0, y1 in row_blocks(output_height, width):
            acc = scratch.array("depthwise.acc", (y1 - y0, width), sums)
            for w, (view, weights) in enumerate(zip(views, window_weights, strict=True)):
                if w == 0:
                    np.einsum("yijk,ijk->yk", view[y0:y1], weights, out=acc)  # exact: integer sums below 2^24
                else:
                    part = scratch.array("depthwise.part", (y1 - y0, width), sums)
                    np.add(acc, np.einsum("yijk,ijk->yk", view[y0:y1], weights, out=part), out=acc)
            requantize(acc, output[n, y0:y1])  # +bias, requantize, +output offset, clamp
    return output.reshape(batches, output_height, output_width, channels)


def depthwise_conv_2d_rows(input_data: np.ndarray, filter_taps: np.ndarray, input_zero_point: int, padding: Padding,
                           depth_multiplier: int, stride_height: int, stride_width: int, grid: PhaseGrid,
                           requantize: Requantizer, scratch: Scratch) -> np.ndarray:
    """depthwise_conv_2d as app.emulator.accel's numba kernel: one pass per output row, float32 sums.

    filter_taps: [taps, grid.columns * output_depth], each tap's weights repeated along a phase row.
    """
    from app.emulator import accel

    source = input_data if depth_multiplier == 1 else np.repeat(input_data, depth_multiplier, axis=3)
    batches, _, _, channels = source.shape
    phases = _phase_stack(source, input_zero_point, padding, stride_height, stride_width, grid, filter_taps.dtype,
                          scratch)
    row = grid.columns * channels
    out = np.empty((batches, padding.output_height, row), np.uint8)
    accel.depthwise_requantize(phases, grid.phase_of_tap, grid.offset_of_tap * channels, filter_taps,
                               padding.output_height, row, *requantize.kernel_arguments(row), out)
    out = out.reshape(batches, padding.output_height, grid.columns, channels)[:, :, :padding.output_width, :]
    return np.ascontiguousarray(out).view(requantize.params.output_dtype)


def _phase_stack(source: np.ndarray, input_zero_point: int, padding: Padding, stride_height: int, stride_width: int,
                 grid: PhaseGrid, dtype, scratch: Scratch) -> np.ndarray:
    """The padded input split by stride phase: [phases, batches, grid.rows * grid.columns * channels].

    Phase (a, b) holds padded rows a, a + s, ..., i.e. input rows a - top, a - top + s, ...: each
    phase is copied from the input directly, and only the frame around it is set to the zero point.
    """
    batches, height, width, channels = source.shape
    stack = scratch.array("depthwise.phases", (len(grid.phases), batches, grid.rows, grid.columns, channels), dtype)
    for p, (a, b) in enumerate(grid.phases):
        top = -(-(padding.top - a) // stride_height)  # first phase row inside the input
        left = -(-(padding.left - b) // stride_width)
        part = source[:, a + top * stride_height - padding.top::stride_height,
                      b + left * stride_width - padding.left::stride_width, :]
        bottom, right = top + part.shape[1], left + part.shape[2]
        phase = stack[p]
        phase[:, :top].fill(input_zero_point)
        phase[:, bottom:].fill(input_zero_point)
        phase[:, top:bottom, :left].fill(input_zero_point)
        phase[:, top:bottom, right:].fill(input_zero_point)
        np.copyto(phase[:, top:bottom, left:right], part)
    return stack.reshape(len(grid.phases), batches, -1)


def transpose_conv(input_data: np.ndarray, filter_matrix: np.ndarray, bias: np.ndarray, input_offset: int,
                   output_multiplier: np.ndarray, output_shift: np.ndarray, output_offset: int, pad_height: int,
                   pad_width: int, stride_height: int, stride_width: int, filter_height: int, filter_width: int,
                   output_shape: tuple[int, ...], quantized_activation_min: int, quantized_activation_max: int,
                   rounding: Rounding) -> np.ndarray:
    """reference_integer_ops::TransposeConv (int8, per channel) and reference_ops::TransposeConv (uint8), NHWC.

    filter_matrix: float64 [input_depth, filter_height * filter_width * output_depth], filter offset applied.
    Each input value (plus input_offset) scatters its products with the filter onto the output
    window at (in_y * stride_height - pad_height, in_x * stride_width - pad_width); products that
    fall outside the output are dropped. Then, per output value: +bias, requantize, +output offset, clamp.
    """
    batches, input_height, input_width, input_depth = input_data.shape
    _, output_height, output_width, output_depth = output_shape
    products = (input_data.reshape(-1, input_depth).astype(np.float64) + input_offset) @ filter_matrix
    products = products.astype(np.int64).reshape(batches, input_height, input_width, filter_height, filter_width,
                                                 output_depth)  # exact integers, below 2^53
    # the whole scattered window, in "padded output" coordinates: out_y + pad_height
    height = max((input_height - 1) * stride_height + filter_height, pad_height + output_height)
    width = max((input_width - 1) * stride_width + filter_width, pad_width + output_width)
    scattered = np.zeros((batches, height, width, output_depth), np.int64)
    for filter_y in range(filter_height):
        for filter_x in range(filter_width):
            scattered[:, filter_y:filter_y + (input_height - 1) * stride_height + 1:stride_height,
                      filter_x:filter_x + (input_width - 1) * stride_width + 1:stride_width, :] += \
                products[:, :, :, filter_y, filter_x, :]
    acc = scattered[:, pad_height:pad_height + output_height, pad_width:pad_width + output_width, :]  # accumulate
    acc = acc + bias  # +bias
    acc = multiply_by_quantized_multiplier(acc, output_multiplier, output_shift, rounding)  # requantize
    acc = acc + output_offset  # +output offset
    return np.clip(acc, quantized_activation_min, quantized_activation_max)  # clamp


# ---- prepare: what TFLite's Prepare computes, once per model ----

def filter_and_bias(view: OpView, channel_axis: int, input_dtype: np.dtype, scalar_path: bool,
                    positions: tuple[int, int, int] = (0, 1, 2), per_channel_offset: bool = True):
    """Centered int64 filter, the real multiplier per channel, int64 bias, all checked against TFLite's rules.

    scalar_path: the kernel takes TFLite's single (per-tensor) multiplier, whose real value is
    computed with the scale product in float; the per-channel arrays compute it in double.
    positions: where the operator has its input, filter and bias (TRANSPOSE_CONV: 2, 1, 3).
    per_channel_offset: False where the per-channel kernel has no filter offset at all (FULLY_CONNECTED:
    weights are symmetric by the spec, so their zero points are not read); True refuses nonzero ones.
    """
    input_tensor, filter_tensor, output = view.input(positions[0]), view.input(positions[1]), view.output()
    filter_dtype = quantized_type(filter_tensor, "filter")
    if filter_tensor.data is None:
        raise Unsupported("the filter must be a constant tensor")
    if filter_dtype != input_dtype:
        raise Unsupported(f"filter is {filter_tensor.type}, input {input_tensor.type}; hybrid kernels are not emulated")
    output_dtype = quantized_type(output, "output")
    if output_dtype != input_dtype:
        raise Unsupported(f"output is {output.type}, input {input_tensor.type}; expected the same type")
    quantization = filter_tensor.quantization
    channels = filter_tensor.shape[channel_axis]
    filter_scales = quantization.scale.astype(np.float64)
    filter_zero_points = quantization.zero_point
    if quantization.per_channel:
        if input_dtype == np.uint8:
            raise Unsupported("uint8 filters quantized per channel are not supported by TFLite")
        if quantization.axis != channel_axis or filter_scales.size != channels:
            raise Unsupported(f"per-channel filter quantization along axis {quantization.axis} with "
                              f"{filter_scales.size} scales; expected axis {channel_axis} with {channels}")
        if not per_channel_offset:
            filter_zero_points = np.zeros(channels, np.int64)  # the kernel reads none
        elif np.any(filter_zero_points != 0):
            raise Unsupported("per-channel filter zero points must be 0")
    else:
        filter_scales = np.repeat(filter_scales[:1], channels)
        filter_zero_points = np.repeat(filter_zero_points[:1], channels)
    float_product = scalar_path and not quantization.per_channel
    centered = filter_tensor.data.astype(np.int64)
    shape = [1] * centered.ndim
    shape[channel_axis] = channels
    centered = centered - filter_zero_points.reshape(shape)  # filter_offset
    input_scale = np.float32(scale_of(input_tensor))
    output_scale = np.float64(scale_of(output))
    filter_scales = filter_scales.astype(np.float32)
    if float_product:
        # GetQuantizedConvolutionMultipler: double(input_scale * filter_scale), the product in float
        real = (input_scale * filter_scales).astype(np.float64) / output_scale
    else:
        # the per-channel loop: input_scale * filter_scale / output_scale, all in double
        real = np.float64(input_scale) * filter_scales.astype(np.float64) / output_scale
    bias_tensor = view.input(positions[2])
    if bias_tensor is None:
        bias = np.zeros(channels, np.int64)
    else:
        if bias_tensor.type not in INT32_TYPES or bias_tensor.data is None:
            raise Unsupported(f"bias is {bias_tensor.type}{'' if bias_tensor.data is not None else ', not constant'}; "
                              "expected a constant INT32 tensor")
        bias = bias_tensor.data.astype(np.int64).reshape(-1)
        if bias.size != channels:
            raise Unsupported(f"bias has {bias.size} values for {channels} output channels")
    return centered, bias, real


def matrix_and_requantizer(view: OpView, centered_by_channel: np.ndarray, bias: np.ndarray, real: np.ndarray,
                           input_dtype: np.dtype, activation, rounding: Rounding) -> tuple:
    """Float filter [K, channels] in the cheapest exact type, and the requantizer of the output.

    real: the real multiplier per channel; IN_DOUBLE uses it as it is, the others its QuantizeMultiplier."""
    input_zero_point = zero_point_of(view.input(0))
    output = view.output()
    qmin, qmax = type_range(input_dtype)
    largest_input = max(abs(qmin), abs(qmax))
    magnitude = np.abs(centered_by_channel).sum(axis=0)
    acc_bound = magnitude * largest_input
    float_type = np.float32 if acc_bound.max(initial=0) < FLOAT32_EXACT_INTEGERS else np.float64
    folded_bias = bias - input_zero_point * centered_by_channel.sum(axis=0)  # input_offset * sum(filter)
    act_min, act_max = activation_range(activation, output)
    output_multiplier, output_shift = multipliers(real)
    params = RequantParams(bias=folded_bias, output_multiplier=output_multiplier, output_shift=output_shift,
                           output_offset=zero_point_of(output), quantized_activation_min=act_min,
                           quantized_activation_max=act_max, output_dtype=input_dtype, rounding=rounding,
                           effective_output_scale=np.asarray(real, np.float64))
    requantizer = Requantizer(params, acc_bound, np.dtype(float_type), view.accelerate, view.scratch)
    return centered_by_channel.astype(float_type), requantizer


def step_details(weights: np.ndarray, requantize: Requantizer) -> dict:
    return {"accumulate": weights.dtype.name, "requantize": requantize.strategy,
            "accelerated": requantize.accelerated}


def input_type(view: OpView) -> np.dtype:
    input_dtype, _, _ = per_tensor(view.input(0), "input")
    per_tensor(view.output(), "output")
    return input_dtype


def prepare_conv_2d(view: OpView) -> Step:
    input_dtype = input_type(view)
    input_shape = view.input(0).shape
    filter_shape = view.input(1).shape
    if len(input_shape) != 4 or len(filter_shape) != 4:
        raise Unsupported(f"input {input_shape} and filter {filter_shape} must both be 4-D")
    out_channels, filter_height, filter_width, filter_depth = filter_shape
    if filter_depth != input_shape[3]:
        raise Unsupported(f"filter depth {filter_depth} != input depth {input_shape[3]} (grouped convolution)")
    o = view.options
    # uint8 runs reference_ops::Conv with the scalar multiplier; int8 the per-channel kernel, always
    centered, bias, real = filter_and_bias(view, 0, input_dtype, input_dtype == np.uint8)
    matrix = centered.reshape(out_channels, -1).T  # [(i, j, c), out]
    filter_matrix, requantize = matrix_and_requantizer(view, matrix, bias, real,
                                                        input_dtype, o.get("fusedActivationFunction", 0), CONV_ROUNDING)
    stride_h, stride_w = o.get("strideH", 1), o.get("strideW", 1)
    dilation_h, dilation_w = o.get("dilationHFactor", 1), o.get("dilationWFactor", 1)
    padding = compute_padding(o.get("padding", 0), input_shape[1], input_shape[2], filter_height, filter_width,
                              stride_h, stride_w, dilation_h, dilation_w)
    zero_point = zero_point_of(view.input(0))

    def run(x: np.ndarray) -> np.ndarray:
        return conv_2d(x, filter_matrix, zero_point, padding, filter_height, filter_width, stride_h, stride_w,
                       dilation_h, dilation_w, requantize, view.scratch)

    return view.step(run, 0, **step_details(filter_matrix, requantize))


def prepare_depthwise_conv_2d(view: OpView) -> Step:
    input_dtype = input_type(view)
    input_shape = view.input(0).shape
    filter_shape = view.input(1).shape
    if len(input_shape) != 4 or len(filter_shape) != 4 or filter_shape[0] != 1:
        raise Unsupported(f"input {input_shape} and filter {filter_shape}: expected 4-D, filter [1, h, w, c]")
    _, filter_height, filter_width, out_channels = filter_shape
    o = view.options
    depth_multiplier = out_channels // input_shape[3]
    if depth_multiplier * input_shape[3] != out_channels:
        raise Unsupported(f"filter has {out_channels} channels for an input of {input_shape[3]}")
    centered, bias, real = filter_and_bias(view, 3, input_dtype, input_dtype == np.uint8)
    stride_h, stride_w = o.get("strideH", 1), o.get("strideW", 1)
    dilation_h, dilation_w = o.get("dilationHFactor", 1), o.get("dilationWFactor", 1)
    padding = compute_padding(o.get("padding", 0), input_shape[1], input_shape[2], filter_height, filter_width,
                              stride_h, stride_w, dilation_h, dilation_w)
    grid = PhaseGrid.of(padding, input_shape[1] + padding.top + padding.bottom,
                        input_shape[2] + padding.left + padding.right, filter_height, filter_width, stride_h, stride_w,
                        dilation_h, dilation_w)
    taps = centered.reshape(filter_height * filter_width, out_channels)
    filter_taps, requantize = matrix_and_requantizer(view, taps, bias, real,
                                                      input_dtype, o.get("fusedActivationFunction", 0), CONV_ROUNDING)
    zero_point = zero_point_of(view.input(0))
    if requantize.accelerated and filter_taps.dtype == np.float32:  # the numba kernel (float32 sums only)
        filter_taps = np.tile(filter_taps, (1, grid.columns))  # each tap's weights along a whole phase row

        def run(x: np.ndarray) -> np.ndarray:
            return depthwise_conv_2d_rows(x, filter_taps, zero_point, padding, depth_multiplier, stride_h, stride_w,
                                          grid, requantize, view.scratch)

        return view.step(run, 0, **step_details(filter_taps, requantize))
    window_weights = tuple(np.tile(filter_taps[list(window.taps)], (1, padding.output_width))
                           .reshape(window.rows, window.columns, -1) for window in grid.windows)

    def run(x: np.ndarray) -> np.ndarray:
        return depthwise_conv_2d(x, window_weights, zero_point, padding, depth_multiplier, stride_h, stride_w, grid,
                                 requantize, view.scratch)

    return view.step(run, 0, **step_details(filter_taps, requantize))


def prepare_transpose_conv(view: OpView) -> Step:
    """Inputs: output_shape (constant), filter [output_depth, h, w, input_depth], input, optional bias."""
    input_tensor, filter_tensor, output = view.input(2), view.input(1), view.output()
    input_dtype, _, input_zero_point = per_tensor(input_tensor, "input")
    _, _, output_zero_point = per_tensor(output, "output")
    input_shape, filter_shape, output_shape = input_tensor.shape, filter_tensor.shape, output.shape
    if len(input_shape) != 4 or len(filter_shape) != 4 or len(output_shape) != 4:
        raise Unsupported(f"input {input_shape}, filter {filter_shape} and output {output_shape} must all be 4-D")
    declared = tuple(int(d) for d in np.asarray(view.constant(0, "output_shape")).reshape(-1))
    if declared != output_shape:
        raise Unsupported(f"output_shape {list(declared)} differs from the output tensor's {list(output_shape)}")
    output_depth, filter_height, filter_width, filter_depth = filter_shape
    if filter_depth != input_shape[3] or output_depth != output_shape[3] or input_shape[0] != output_shape[0]:
        raise Unsupported(f"input {input_shape}, filter {filter_shape} and output {output_shape} do not match")
    # uint8: one multiplier from the float scale product, as CONV_2D; int8: per channel, in double
    centered, bias, real = filter_and_bias(view, 0, input_dtype, input_dtype == np.uint8, positions=(2, 1, 3))
    output_multiplier, output_shift = multipliers(real)
    if input_dtype == np.int8 and np.any(filter_tensor.quantization.zero_point != 0):
        raise Unsupported("int8 filter zero points must be 0 (the int8 kernel has no filter offset)")
    filter_matrix = centered.transpose(3, 1, 2, 0).reshape(filter_depth, -1).astype(np.float64)  # [in, (h, w, out)]
    o = view.options
    stride_h, stride_w = o.get("strideH", 1), o.get("strideW", 1)
    # ComputePaddingHeightWidth with the output as the convolution's input (transpose_conv.cc Eval)
    padding = compute_padding(o.get("padding", 0), output_shape[1], output_shape[2], filter_height, filter_width,
                              stride_h, stride_w)
    if (padding.output_height, padding.output_width) != input_shape[1:3]:
        raise Unsupported(f"a convolution of the {output_shape[1]}x{output_shape[2]} output gives "
                          f"{padding.output_height}x{padding.output_width}, not the input's "
                          f"{input_shape[1]}x{input_shape[2]} (TFLite's check)")
    act_min, act_max = activation_range(o.get("fusedActivationFunction", 0), output)
    rounding = TRANSPOSE_CONV_ROUNDING

    def run(x: np.ndarray) -> np.ndarray:
        return transpose_conv(x, filter_matrix, bias, -input_zero_point, output_multiplier, output_shift,
                              output_zero_point, padding.top, padding.left, stride_h, stride_w, filter_height,
                              filter_width, output_shape, act_min, act_max, rounding).astype(input_dtype)

    return view.step(run, 2, accumulate="float64", requantize="fixedpoint", accelerated=False)


PREPARE = {
    "CONV_2D": prepare_conv_2d,
    "DEPTHWISE_CONV_2D": prepare_depthwise_conv_2d,
    "TRANSPOSE_CONV": prepare_transpose_conv,
}
