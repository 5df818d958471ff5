"""QUANTIZE (float -> 8-bit, and 8-bit -> 8-bit requantization, int8 <-> uint8) and DEQUANTIZE.

An op on one 8-bit input is a function of one byte: kernels are evaluated once on the 256
values at load and run as a table look-up (ByteTable), exact by construction.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier, quantize_multiplier, round_half_away
from app.emulator.kernels.common import QUANTIZED_TYPES, OpView, Step, per_tensor, type_range

# Measured on the pinned runtime (tests/test_emulator_quantize.py).
REQUANTIZE_ROUNDING = Rounding.DOUBLE_ROUNDING


class ByteTable:
    """out = table[x] for an 8-bit tensor x: a unary kernel evaluated on all 256 values at load."""

    def __init__(self, kernel, input_dtype: np.dtype, output_dtype: np.dtype):
        values = np.arange(256, dtype=np.uint8).view(input_dtype)
        self.table = np.asarray(kernel(values)).astype(output_dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.table.take(np.asarray(x).view(np.uint8))  # take: ~2.4x faster than table[x] here


def requantize(input_data, effective_scale_multiplier: int, effective_scale_shift: int, input_zeropoint: int,
               output_zeropoint: int, output_min: int, output_max: int, rounding: Rounding) -> np.ndarray:
    """reference_ops::Requantize: 8-bit to 8-bit with a new scale and zero point."""
    value = np.asarray(input_data, np.int64) - input_zeropoint
    output = multiply_by_quantized_multiplier(value, effective_scale_multiplier, effective_scale_shift, rounding)
    return np.clip(output + output_zeropoint, output_min, output_max)


def affine_quantize(input_data: np.ndarray, scale: float, zero_point: int, output_min: int,
                    output_max: int) -> np.ndarray:
    """reference_ops::AffineQuantize: TfLiteRound(x / scale) + zero_point; the division in float (measured)."""
    value = (np.asarray(input_data, np.float32) / np.float32(scale)).astype(np.float32)
    value = np.clip(round_half_away(value).astype(np.float64), -(2.0**31), 2.0**31 - 1)
    return np.clip(value.astype(np.int64) + zero_point, output_min, output_max)


def dequantize(input_data, scale: float, zero_point: int) -> np.ndarray:
    """reference_ops::Dequantize: float(scale * (q - zero_point)), scale held as a double."""
    return (np.float64(scale) * (np.asarray(input_data, np.int64) - zero_point)).astype(np.float32)


def prepare_quantize(view: OpView) -> Step:
    source, output = view.input(0), view.output()
    output_dtype, output_scale, output_zero_point = per_tensor(output, "output")
    output_min, output_max = type_range(output_dtype)
    if source.type == "FLOAT32":
        def run_float(x: np.ndarray) -> np.ndarray:
            return affine_quantize(x, output_scale, output_zero_point, output_min, output_max).astype(output_dtype)

        return view.step(run_float, 0)
    if source.type not in QUANTIZED_TYPES:
        raise Unsupported(f"input is {source.type}; expected FLOAT32, INT8 or UINT8")
    input_dtype, input_scale, input_zero_point = per_tensor(source, "input")
    multiplier, shift = quantize_multiplier(np.float64(input_scale) / np.float64(output_scale))
    table = ByteTable(lambda q: requantize(q, multiplier, shift, input_zero_point, output_zero_point,
                                           output_min, output_max, REQUANTIZE_ROUNDING), input_dtype, output_dtype)
    return view.step(table, 0)


def prepare_dequantize(view: OpView) -> Step:
    if view.output().type != "FLOAT32":
        raise Unsupported(f"output is {view.output().type}; expected FLOAT32")
    input_dtype, scale, zero_point = per_tensor(view.input(0), "input")
    table = ByteTable(lambda q: dequantize(q, scale, zero_point), input_dtype, np.float32)
    return view.step(table, 0)


PREPARE = {"QUANTIZE": prepare_quantize, "DEQUANTIZE": prepare_dequantize}
