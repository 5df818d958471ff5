"""Optional numba kernels for the two hot spots: depthwise convolution and requantization.

The numpy path is the emulator's definition and always available; these functions compute the
same values in one pass over memory instead of one numpy pass per tap and per operation. They
are used only where they are provably the same arithmetic:
- products and sums of 8-bit values are exact integers in float32 below 2^24 (checked at load
  for the numpy path too), so the order of accumulation cannot change a result;
- the requantization repeats the float64 evaluation the load-time proof accepted, operation by
  operation (numba compiles without fast-math, so no fused multiply-add or reassociation).
tests/test_emulator_accel.py runs both paths on the same models and requires identical bytes.

Install with `pip install 'edgetpu-serve[accel]'`; without numba, or with
EDGETPU_SERVE_EMULATOR_ACCEL=0, the numpy path runs.
"""

from __future__ import annotations

import logging
import os
from functools import cache

import numpy as np

log = logging.getLogger(__name__)
DISABLE_VARIABLE = "EDGETPU_SERVE_EMULATOR_ACCEL"


@cache
def _kernels():
    try:
        import numba
    except ImportError:
        return None
    njit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")

    @njit
    def requantize_row(acc, scale, constant, sign_step, tail, signed_form, low, high, out):
        """out[k] = the proven float64 evaluation of acc[k] (its low byte); the constants are tiled to the row."""
        if signed_form:
            for k in range(acc.shape[0]):
                u = np.float64(acc[k]) * scale[k]
                u = u + constant[k]
                u = u + np.sign(u) * sign_step[k]
                u = u + tail
                u = min(max(u, low), high)
                out[k] = np.uint8(np.int32(u))
        else:
            for k in range(acc.shape[0]):
                u = np.float64(acc[k]) * scale[k]
                u = u + constant[k]
                u = min(max(u, low), high)
                out[k] = np.uint8(np.int32(u))

    @njit
    def requantize_rows(acc, scale, constant, sign_step, tail, signed_form, low, high, out):
        for r in range(acc.shape[0]):
            requantize_row(acc[r], scale, constant, sign_step, tail, signed_form, low, high, out[r])

    @njit
    def depthwise_requantize(phases, tap_phase, tap_offset, weights, output_height, width, scale, constant,
                             sign_step, tail, signed_form, low, high, out):
        """Depthwise taps over one output row at a time (float32, exact), then that row's requantization.

        phases: [phases, batches, flat]; a row of the phase grid has `width` = columns * channels values;
        weights and the requantization constants are tiled to that row.
        """
        batches = phases.shape[1]
        taps = weights.shape[0]
        acc = np.empty(width, np.float32)
        for n in range(batches):
            for y in range(output_height):
                acc[:] = 0
                for t in range(taps):
                    start = y * width + tap_offset[t]
                    source = phases[tap_phase[t], n, start:start + width]  # a slice: LLVM then vectorises
                    weight = weights[t]
                    for k in range(width):
                        acc[k] += source[k] * weight[k]
                requantize_row(acc, scale, constant, sign_step, tail, signed_form, low, high, out[n, y])

    return requantize_rows, depthwise_requantize


def available() -> bool:
    """numba importable and not switched off by EDGETPU_SERVE_EMULATOR_ACCEL=0."""
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        return False
    return _kernels() is not None


def requantize_rows(*args) -> None:
    _kernels()[0](*args)


def depthwise_requantize(*args) -> None:
    _kernels()[1](*args)
