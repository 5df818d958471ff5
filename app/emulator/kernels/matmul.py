"""FULLY_CONNECTED and BATCH_MATMUL: matrix products, of a weight matrix or of two tensors the graph computes.

TFLite's reference kernels (reference/integer_ops/fully_connected.h, reference/fully_connected.h,
reference/batch_matmul.h; kernels/fully_connected.cc and batch_matmul.cc of LiteRT 2.2, ai-edge-litert 2.3.0):

- FULLY_CONNECTED, 8-bit: acc = sum_d (filter + filter_offset) * (input + input_offset) (int32), + bias;
  then acc_scaled = round(double(acc) * effective_output_scale) (Rounding.IN_DOUBLE: no fixed-point
  multiplier, the scale input_scale * filter_scale / output_scale in double), + output offset, clamped to
  the fused activation. A per-channel filter has no offset (its zero points are not read).
  The filter is a constant (weights: centered and made float once at load, the input offset folded into
  the bias) or a tensor the graph computes: the attention of YOLO11's C2PSA block, unrolled per head by
  the converters of Ultralytics' exports, multiplies by a softmax or a key matrix. Then both operands are
  centered at each call (fully_connected_computed_filter).
- BATCH_MATMUL, int8: the kernel is called with its operands swapped (the RHS first: its GEMM wants the RHS
  transposed), which changes nothing in integers: acc = sum_k (lhs + lhs_offset) * (rhs + rhs_offset),
  then MultiplyByQuantizedMultiplier (DOUBLE_ROUNDING in this build) with the multiplier of
  GetQuantizedConvolutionMultipler (the scales' product in float), + output offset, clamped to int8 (no
  fused activation). With an int32 output the raw int8 products are summed, zero points ignored. Batch
  dimensions broadcast as numpy's matmul broadcasts them; adj_x and adj_y transpose an operand's last two
  dimensions; the kernel's "shape compression" of an RHS [..., 1, K, N] computes the same products.
- float32, both: total = 0.0f, then total += a * b for k = 0 .. K-1, each product and sum rounded to float
  (compiled without fused multiply-add or reassociation), so the sum runs in that order here too, one
  numpy pass per k over all outputs (accumulate_in_order, which also picks the NaN x86 returns where two meet). FULLY_CONNECTED then adds the bias (0.0f
  without one: -0.0 becomes +0.0) and clamps with std::max/std::min (NaN passes, infinities become
  +-FLT_MAX without an activation); BATCH_MATMUL writes the sum as it is.

8-bit products are summed in float: exact integers while every partial sum is below 2^24 in float32
(|acc| <= depth * max |x - zp| * max |w - zp|, decided at load), in float64 otherwise, so BLAS's order of
summation cannot change a result.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, wrap_int32
from app.emulator.kernels.arithmetic import activation_function_with_min_max, calculate_activation_range
from app.emulator.kernels.common import (
    OpView,
    Step,
    activation_range,
    multipliers,
    per_tensor,
    quantized_type,
    scale_of,
    tensor_type,
    type_range,
    zero_point_of,
)
from app.emulator.kernels.conv import INT32_TYPES, filter_and_bias, input_type, matrix_and_requantizer, step_details
from app.emulator.requantize import FLOAT32_EXACT_INTEGERS, Requantizer, RequantParams

# Measured on the pinned runtime (tests/test_emulator_rounding.py): the reference FULLY_CONNECTED requantizes in
# double; BATCH_MATMUL calls MultiplyByQuantizedMultiplier, which rounds twice in this build.
FULLY_CONNECTED_ROUNDING = Rounding.IN_DOUBLE
BATCH_MATMUL_ROUNDING = Rounding.DOUBLE_ROUNDING
# GetQuantizedConvolutionMultipler's check on a bias: |input_scale * filter_scale - bias_scale| / output_scale.
BIAS_SCALE_TOLERANCE = 0.02
BATCH_MATMUL_RANKS = (2, 5)
# The float loops as compiled (clang, x86-64): products 4 at a time, summed in order (see accumulate_in_order).
SUM_LANES = 4
QUIET_NAN_BIT = np.uint32(0x00400000)


# ---- the kernels ----

def fully_connected(input_data: np.ndarray, filter_matrix: np.ndarray, output_shape: tuple[int, ...],
                    requantize: Requantizer) -> np.ndarray:
    """reference_integer_ops::FullyConnected / FullyConnectedPerChannel (int8), reference_ops::FullyConnected (uint8).

    filter_matrix: [depth, units], the filter offset applied; the input offset is folded into the bias (no
    padding here, so it is exact).
    """
    depth = filter_matrix.shape[0]
    acc = input_data.reshape(-1, depth).astype(filter_matrix.dtype) @ filter_matrix  # accumulate
    return requantize(acc).reshape(output_shape)  # +bias, requantize, +output offset, clamp


def fully_connected_computed_filter(input_data: np.ndarray, filter_data: np.ndarray, input_offset: int,
                                    filter_offset: int, accumulate: np.dtype, output_shape: tuple[int, ...],
                                    requantize: Requantizer) -> np.ndarray:
    """reference_integer_ops::FullyConnected (int8) and reference_ops::FullyConnected (uint8) with a filter the
    graph computes: both operands centered (as exact integers in `accumulate`) at each call."""
    depth = filter_data.shape[1]
    inputs = np.add(input_data.reshape(-1, depth), input_offset, dtype=accumulate)    # input_val + input_offset
    filters = np.add(filter_data, filter_offset, dtype=accumulate)                   # filter_val + filter_offset
    acc = inputs @ filters.T  # accumulate
    return requantize(acc).reshape(output_shape)  # (no bias), requantize, +output offset, clamp


def _quiet(values: np.ndarray) -> np.ndarray:
    """A NaN as x86's arithmetic returns it: its quiet bit set."""
    return (values.view(np.uint32) | QUIET_NAN_BIT).view(np.float32)


def accumulate_in_order(lhs: np.ndarray, rhs: np.ndarray, product_nan_from_rhs: bool) -> np.ndarray:
    """float32 [..., M, K] x [..., K, N] -> [..., M, N] summed as the reference loops sum: total = 0.0f, then
    total += lhs[m, k] * rhs[k, n] for k in order, every product and sum rounded to float32.

    The values are IEEE's whatever the order of operands; where two NaNs meet, the one x86 returns is the first
    operand's, and the compiled loops order them so (measured): a product keeps the input's NaN (FULLY_CONNECTED)
    or the RHS's (BATCH_MATMUL, whose kernel takes its operands swapped: product_nan_from_rhs); a sum keeps the
    product's NaN over the first SUM_LANES * (K // SUM_LANES) values of k (clang's loop, 4 products at a time,
    added in order) and the running total's over the rest. numpy's own choice differs, so it is set where both
    are NaN; with finite operands no product is NaN and the check is skipped.
    """
    shape = np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]) + (lhs.shape[-2], rhs.shape[-1])
    depth = lhs.shape[-1]
    total = np.zeros(shape, np.float32)
    product = np.empty(shape, np.float32)
    nan_possible = not (np.isfinite(lhs).all() and np.isfinite(rhs).all())
    blocked = SUM_LANES * (depth // SUM_LANES)
    for k in range(depth):
        a, b = lhs[..., :, k:k + 1], rhs[..., k:k + 1, :]
        np.multiply(a, b, out=product)
        if not nan_possible:
            np.add(total, product, out=total)
            continue
        both = np.isnan(a) & np.isnan(b)
        if both.any():
            first = np.broadcast_to(b if product_nan_from_rhs else a, shape)
            product[both] = _quiet(np.ascontiguousarray(first[both]))
        if k < blocked:
            np.copyto(total, add_keeping_first_nan(product, total))
        else:
            np.copyto(total, add_keeping_first_nan(total, product))
    return total


def add_keeping_first_nan(first: np.ndarray, second) -> np.ndarray:
    """first + second, where both are NaN the first (x86's addss returns its first operand's): numpy's SIMD loops
    pick either, so it is set here."""
    result = np.add(first, second)
    both = np.isnan(first) & np.isnan(second)
    if both.any():
        result[both] = np.broadcast_to(first, result.shape)[both]
    return result


def fully_connected_float(input_data: np.ndarray, weights_data: np.ndarray, bias_data: np.ndarray | None,
                          output_activation_min, output_activation_max, output_shape: tuple[int, ...]) -> np.ndarray:
    """reference_ops::FullyConnected (float): the products summed in order, + bias (0.0f without), then the range."""
    depth = weights_data.shape[1]
    total = accumulate_in_order(input_data.reshape(-1, depth), weights_data.T, product_nan_from_rhs=False)
    bias_value = bias_data if bias_data is not None else np.float32(0.0)
    return activation_function_with_min_max(add_keeping_first_nan(total, bias_value), output_activation_min,
                                            output_activation_max).reshape(output_shape)


def _operands(lhs: np.ndarray, rhs: np.ndarray, adj_x: bool, adj_y: bool) -> tuple[np.ndarray, np.ndarray]:
    """[..., M, K] and [..., K, N]: the operands with adj_x / adj_y's transposes undone (views, no copy)."""
    return (lhs.swapaxes(-1, -2) if adj_x else lhs), (rhs.swapaxes(-1, -2) if adj_y else rhs)


def batch_matmul(lhs_data: np.ndarray, rhs_data: np.ndarray, lhs_offset: int, rhs_offset: int, adj_x: bool,
                 adj_y: bool, accumulate: np.dtype, requantize: Requantizer) -> np.ndarray:
    """reference_ops::BatchMatMul<int8_t, int32_t> (FullyConnectedParams): int8 in, int8 out."""
    lhs = np.add(lhs_data, lhs_offset, dtype=accumulate)
    rhs = np.add(rhs_data, rhs_offset, dtype=accumulate)
    acc = np.matmul(*_operands(lhs, rhs, adj_x, adj_y))  # accumulate, batch dimensions broadcast
    return requantize(acc)  # requantize, +output offset, clamp


def batch_matmul_int32(lhs_data: np.ndarray, rhs_data: np.ndarray, adj_x: bool, adj_y: bool) -> np.ndarray:
    """reference_ops::BatchMatMul<int8, int8, int32>: the raw products summed (in int32, wrapping), no offsets."""
    acc = np.matmul(*_operands(lhs_data.astype(np.float64), rhs_data.astype(np.float64), adj_x, adj_y))
    return wrap_int32(acc.astype(np.int64)).astype(np.int32)  # exact: |acc| <= K * 2^14, far below 2^53


def batch_matmul_float(lhs_data: np.ndarray, rhs_data: np.ndarray, adj_x: bool, adj_y: bool) -> np.ndarray:
    """reference_ops::BatchMatMul<float>: the products summed in order."""
    return accumulate_in_order(*_operands(lhs_data, rhs_data, adj_x, adj_y), product_nan_from_rhs=True)


# ---- prepare: what TFLite's Prepare computes, once per model ----

def _largest_offset_value(dtype: np.dtype, zero_point: int) -> int:
    """max |q - zero_point| over the type's values."""
    low, high = type_range(dtype)
    return max(zero_point - low, high - zero_point)


def _exact_float_type(depth: int, *largest: int) -> np.dtype:
    """float32 when every partial sum of `depth` products is an integer below 2^24, else float64."""
    bound = depth * int(np.prod(largest))
    return np.dtype(np.float32 if bound < FLOAT32_EXACT_INTEGERS else np.float64)


def _fully_connected_output_shape(view: OpView, depth: int, units: int) -> tuple[int, ...]:
    """UpdateOutputSize: the input's dimensions with the last one `units` (keep_num_dims), else [batches, units];
    it must be the shape the file declares (the graph's later operators were prepared with it)."""
    input_shape = view.input(0).shape
    size = int(np.prod(input_shape))
    if depth == 0 or size % depth:
        raise Unsupported(f"input {list(input_shape)} does not split into rows of {depth}")
    if view.options.get("keepNumDims", False):
        if input_shape[-1] != depth:
            raise Unsupported(f"keep_num_dims with input {list(input_shape)}: its last dimension must be {depth}")
        shape = (*input_shape[:-1], units)
    else:
        shape = (size // depth, units)
    if tuple(view.output().shape) != shape:
        raise Unsupported(f"output declared {list(view.output().shape)}; TFLite's Prepare gives {list(shape)}")
    return shape


def _check_bias_scale(view: OpView) -> None:
    """GetQuantizedConvolutionMultipler (per-tensor filters): a bias quantized far from input * filter fails Prepare."""
    bias, filter_tensor = view.input(2), view.input(1)
    if bias is None or bias.quantization is None or filter_tensor.quantization.per_channel:
        return
    product = np.float64(scale_of(view.input(0))) * np.float64(scale_of(filter_tensor))
    if abs(product - np.float64(np.float32(bias.quantization.scale[0]))) / np.float64(scale_of(view.output())) \
            > BIAS_SCALE_TOLERANCE:
        raise Unsupported(f"bias scale {float(bias.quantization.scale[0])} differs from input * filter scale "
                          f"{product} beyond TFLite's tolerance")


def _prepare_fully_connected_constant(view: OpView) -> Step:
    input_dtype = input_type(view)
    units, depth = view.input(1).shape
    output_shape = _fully_connected_output_shape(view, depth, units)
    centered, bias, real = filter_and_bias(view, 0, input_dtype, False, per_channel_offset=False)
    _check_bias_scale(view)
    filter_matrix, requantize = matrix_and_requantizer(view, centered.T, bias, real, input_dtype,
                                                       view.options.get("fusedActivationFunction", 0),
                                                       FULLY_CONNECTED_ROUNDING)

    def run(x: np.ndarray) -> np.ndarray:
        return fully_connected(x, filter_matrix, output_shape, requantize)

    return view.step(run, 0, **step_details(filter_matrix, requantize))


def _prepare_fully_connected_computed_filter(view: OpView) -> Step:
    """Both operands at run time; their zero points, the multipliers and the exact float type decided here."""
    input_tensor, filter_tensor, output = view.input(0), view.input(1), view.output()
    input_dtype, input_scale, input_zero_point = per_tensor(input_tensor, "input")
    filter_dtype = quantized_type(filter_tensor, "filter")
    output_dtype, _, output_zero_point = per_tensor(output, "output")
    if filter_dtype != input_dtype or output_dtype != input_dtype:
        raise Unsupported(f"input {input_tensor.type}, filter {filter_tensor.type}, output {output.type}; "
                          "expected one 8-bit type")
    bias_tensor = view.input(2)
    if bias_tensor is not None:
        raise Unsupported("a bias beside a computed filter is not emulated (converters write none there)")
    units, depth = filter_tensor.shape
    output_shape = _fully_connected_output_shape(view, depth, units)
    quantization = filter_tensor.quantization
    if quantization.per_channel:
        if input_dtype == np.uint8:
            raise Unsupported("uint8 filters quantized per channel are not supported by TFLite")
        if quantization.axis != 0 or quantization.scale.size != units:
            raise Unsupported(f"per-channel filter quantization along axis {quantization.axis} with "
                              f"{quantization.scale.size} scales; expected axis 0 with {units}")
        filter_scales, filter_offset = quantization.scale.astype(np.float32), 0  # the per-channel kernel: no offset
    else:
        filter_scales = np.repeat(np.float32(scale_of(filter_tensor)), units)
        filter_offset = -zero_point_of(filter_tensor)
    # effective_output_scale = double(input_scale) * double(filter_scale) / double(output_scale)
    real = np.float64(np.float32(input_scale)) * filter_scales.astype(np.float64) / np.float64(scale_of(output))
    largest_filter = _largest_offset_value(filter_dtype, -filter_offset)
    accumulate = _exact_float_type(depth, _largest_offset_value(input_dtype, input_zero_point), largest_filter)
    act_min, act_max = activation_range(view.options.get("fusedActivationFunction", 0), output)
    output_multiplier, output_shift = multipliers(real)
    params = RequantParams(bias=np.zeros(units, np.int64), output_multiplier=output_multiplier,
                           output_shift=output_shift, output_offset=output_zero_point, quantized_activation_min=act_min,
                           quantized_activation_max=act_max, output_dtype=input_dtype,
                           rounding=FULLY_CONNECTED_ROUNDING, effective_output_scale=real)
    bound = depth * _largest_offset_value(input_dtype, input_zero_point) * largest_filter
    requantize = Requantizer(params, np.full(units, bound, np.int64), accumulate, view.accelerate, view.scratch)

    def run(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return fully_connected_computed_filter(x, weights, -input_zero_point, filter_offset, accumulate, output_shape,
                                               requantize)

    return view.step_binding(run, 0, 1, accumulate=accumulate.name, requantize=requantize.strategy,
                             accelerated=requantize.accelerated, filter="computed")


def _prepare_fully_connected_float(view: OpView) -> Step:
    for position, what in ((0, "input"), (1, "filter")):
        tensor_type(view.input(position), what, ("FLOAT32",))
    tensor_type(view.output(), "output", ("FLOAT32",))
    bias_tensor = view.input(2)
    if bias_tensor is not None:
        tensor_type(bias_tensor, "bias", ("FLOAT32",))
    units, depth = view.input(1).shape
    if bias_tensor is not None and int(np.prod(bias_tensor.shape)) != units:
        raise Unsupported(f"bias has {int(np.prod(bias_tensor.shape))} values for {units} units")
    output_shape = _fully_connected_output_shape(view, depth, units)
    act_min, act_max = calculate_activation_range(view.options.get("fusedActivationFunction", 0),
                                                  np.dtype(np.float32))

    def run(x: np.ndarray, weights: np.ndarray, *bias: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN), as in C++
            return fully_connected_float(x, weights, bias[0].reshape(-1) if bias else None, act_min, act_max,
                                         output_shape)

    positions = (0, 1, 2) if bias_tensor is not None else (0, 1)
    return view.step_binding(run, *positions, accumulate="float32 in order")


def prepare_fully_connected(view: OpView) -> Step:
    """The 8-bit kernel (a constant or a computed filter) or the float one, after TFLite's own checks."""
    o = view.options
    if o.get("weightsFormat", 0) != 0:
        raise Unsupported("shuffled weights are not emulated; expected weightsFormat DEFAULT")
    filter_tensor = view.input(1)
    if len(filter_tensor.shape) != 2:
        raise Unsupported(f"filter {list(filter_tensor.shape)}: expected 2-D [units, depth]")
    input_tensor = view.input(0)
    if input_tensor.type == "FLOAT32" and filter_tensor.type != "FLOAT32":
        raise Unsupported(f"float input with a {filter_tensor.type} filter: a hybrid (dynamic-range) model, which the "
                          "emulator does not run; import the full-integer export (Ultralytics writes "
                          "*_full_integer_quant.tflite beside *_int8.tflite)")
    if input_tensor.type == "FLOAT32":
        return _prepare_fully_connected_float(view)
    bias = view.input(2)
    if bias is not None and bias.type not in INT32_TYPES:
        raise Unsupported(f"bias is {bias.type}; expected INT32")
    if filter_tensor.data is None:
        return _prepare_fully_connected_computed_filter(view)
    return _prepare_fully_connected_constant(view)


def _batch_matmul_output_shape(view: OpView) -> tuple[int, ...]:
    """batch_matmul.cc Prepare and ResizeOutputTensor: ranks 2 to 5, broadcast batch dimensions, matching depths."""
    lhs, rhs = view.input(0).shape, view.input(1).shape
    adj_x, adj_y = bool(view.options.get("adjX", False)), bool(view.options.get("adjY", False))
    low, high = BATCH_MATMUL_RANKS
    if not (low <= len(lhs) <= high and low <= len(rhs) <= high):
        raise Unsupported(f"operands {list(lhs)} and {list(rhs)}: TFLite takes ranks {low} to {high}")
    rank = max(len(lhs), len(rhs))
    lhs_x, rhs_x = (1,) * (rank - len(lhs)) + tuple(lhs), (1,) * (rank - len(rhs)) + tuple(rhs)
    batch = []
    for a, b in zip(lhs_x[:-2], rhs_x[:-2]):
        if a != b and a != 1 and b != 1:
            raise Unsupported(f"batch dimensions of {list(lhs)} and {list(rhs)} do not broadcast")
        batch.append(b if a == 1 else a)
    depth_lhs = lhs_x[-2] if adj_x else lhs_x[-1]
    depth_rhs = rhs_x[-1] if adj_y else rhs_x[-2]
    if depth_lhs != depth_rhs:
        raise Unsupported(f"operands {list(lhs)} (adj_x {adj_x}) and {list(rhs)} (adj_y {adj_y}) do not multiply")
    shape = (*batch, lhs_x[-1] if adj_x else lhs_x[-2], rhs_x[-2] if adj_y else rhs_x[-1])
    if tuple(view.output().shape) != shape:
        raise Unsupported(f"output declared {list(view.output().shape)}; TFLite's Prepare gives {list(shape)}")
    return shape


def prepare_batch_matmul(view: OpView) -> Step:
    lhs, rhs, output = view.input(0), view.input(1), view.output()
    adj_x, adj_y = bool(view.options.get("adjX", False)), bool(view.options.get("adjY", False))
    kinds = (lhs.type, rhs.type)
    if kinds == ("FLOAT32", "INT8"):
        raise Unsupported("float LHS with an int8 RHS: a hybrid (dynamic-range) model, which the emulator does not "
                          "run; import the full-integer export")
    if kinds not in (("FLOAT32", "FLOAT32"), ("INT8", "INT8")):
        raise Unsupported(f"operands {lhs.type} and {rhs.type}; the emulator runs float32 and int8 ones")
    output_shape = _batch_matmul_output_shape(view)
    depth = lhs.shape[-2] if adj_x else lhs.shape[-1]
    if lhs.type == "FLOAT32":
        tensor_type(output, "output", ("FLOAT32",))

        def run_float(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN), as in C++
                return batch_matmul_float(x, y, adj_x, adj_y)

        return view.step_binding(run_float, 0, 1, accumulate="float32 in order")
    if output.type == "INT32":  # no quantization read: the raw products
        def run_int32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return batch_matmul_int32(x, y, adj_x, adj_y)

        return view.step_binding(run_int32, 0, 1, accumulate="float64")
    if output.type != "INT8":
        raise Unsupported(f"int8 operands with a {output.type} output; TFLite writes INT8 or INT32")
    _, lhs_scale, lhs_zero_point = per_tensor(lhs, "LHS")
    _, rhs_scale, rhs_zero_point = per_tensor(rhs, "RHS")
    _, output_scale, output_zero_point = per_tensor(output, "output")
    # GetQuantizedConvolutionMultipler: double(lhs_scale * rhs_scale), the product in float, / double(output_scale)
    real = np.float64(np.float32(lhs_scale) * np.float32(rhs_scale)) / np.float64(output_scale)
    columns = output_shape[-1]
    output_multiplier, output_shift = multipliers(np.repeat(real, columns))
    low, high = type_range(np.dtype(np.int8))  # no fused activation: the type's range
    params = RequantParams(bias=np.zeros(columns, np.int64), output_multiplier=output_multiplier,
                           output_shift=output_shift, output_offset=output_zero_point, quantized_activation_min=low,
                           quantized_activation_max=high, output_dtype=np.dtype(np.int8),
                           rounding=BATCH_MATMUL_ROUNDING, effective_output_scale=np.repeat(real, columns))
    largest = (_largest_offset_value(np.dtype(np.int8), lhs_zero_point),
               _largest_offset_value(np.dtype(np.int8), rhs_zero_point))
    accumulate = _exact_float_type(depth, *largest)
    requantize = Requantizer(params, np.full(columns, depth * largest[0] * largest[1], np.int64), accumulate,
                             view.accelerate, view.scratch)

    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return batch_matmul(x, y, -lhs_zero_point, -rhs_zero_point, adj_x, adj_y, accumulate, requantize)

    return view.step_binding(run, 0, 1, accumulate=accumulate.name, requantize=requantize.strategy,
                             accelerated=requantize.accelerated)


PREPARE = {
    "FULLY_CONNECTED": prepare_fully_connected,
    "BATCH_MATMUL": prepare_batch_matmul,
}
