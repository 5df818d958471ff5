"""The accumulator -> int8/uint8 step of every matrix kernel, in a few float passes, proven exact at load.

What it computes, per output channel c (TFLite: acc += bias; MultiplyByQuantizedMultiplier;
+= output_offset; clamp):

    y = clamp(MultiplyByQuantizedMultiplier(acc + bias[c], m[c], s[c]) + output_offset, act_min, act_max)

(FULLY_CONNECTED's reference kernel has no multiplier: y = clamp(round(double(acc + bias[c]) * M[c])
+ output_offset, ...), round half away from zero, M the double quotient of the scales: IN_DOUBLE.)

Why it can be fast and exact. With M = m * 2^(s-31) (exact) and a = acc + bias:
- SINGLE_ROUNDING: MultiplyByQuantizedMultiplier(a) = floor(a * M + 1/2);
- DOUBLE_ROUNDING: it is floor(a * M + 1/2 + e * sign(a)) with e = 2^-(r+1) for a right shift
  r >= 1 (e = 0 otherwise): rounding twice pushes values away from zero by e;
- IN_DOUBLE: floor(fl(a * M) + 1/2), but for negative ties (fl(a * M) = -k - 1/2 exactly, which
  needs a scale of few significant bits) one lower: the signed form with a tiny e breaks those ties.
Either way y is a non-decreasing step function of the integer accumulator with at most 256
steps. The float evaluations used at run time,

    linear:  u = fl(fl(acc * M') + C'),      C' = fl(bias * M + 1/2 [+ e] + output_offset + 256)
    signed:  v = fl(fl(acc * M') + B'),      u = fl(fl(v + fl(e * sign(v))) + (1/2 + output_offset + 256))
    then     y = the low byte of clip(trunc(u), act_min + 256, act_max + 256)

are non-decreasing in acc too (rounding to nearest, truncation and clamping are monotone).
Two non-decreasing integer step functions that agree at both sides of every step of one of
them, and at the ends of the accumulator's range, agree on the whole range. So at load, per
channel, the exact step positions are found with int64 arithmetic, each candidate evaluation
is run at those points, and the cheapest one that agrees everywhere is used: float32 before
float64, linear before signed. A layer where none holds keeps the int64 definition (always
exact, slow). The accumulator's range comes from the weights: |acc| <= sum |w| * max |x|.

trunc(u) is a cast to the narrowest integer type that holds u over the whole range (u's
values at the range's ends bound it, u being monotone), int16 for most layers: the clamp then
runs on 2-byte integers, about a sixth of a float64 clip's time. The offset 256 makes the rest
free: truncation is the floor because nothing below act_min + 256 > 0 survives the clamp, and
the low byte of y + 256 is y's own byte, int8 or uint8, which a cast to uint8 keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier, round_in_double, wrap_int32
from app.emulator.scratch import Scratch

# Added to every result before truncating (see above): y + 256 is positive and has y's low byte.
_BYTE_OFFSET = 256
# Requantization runs over rows of at least this many values (see Requantizer._row_width). Measured
# with numpy 2.4: a pass with a row of per-channel constants broadcast over rows of up to 4096
# values (half numpy's 8192-value buffer) ran ~1.7x slower per value than over rows of 4097.
ROW_VALUES = 5000
# float32 holds every integer up to 2^24 exactly.
FLOAT32_EXACT_INTEGERS = 2**24
# IN_DOUBLE's tie-break in the signed form: below the spacing of a * M's ties for any scale that has them
# (few significant bits), above float64's rounding of u (|u| < 2^10 over the clamped range): the proof decides.
_IN_DOUBLE_TIE_STEP = 2.0**-36


@dataclass(frozen=True)
class RequantParams:
    """The quantities TFLite's Prepare computes for one output tensor of a matrix kernel."""

    bias: np.ndarray               # int64 per output channel, everything added to acc before requantizing
    output_multiplier: np.ndarray  # int64 per channel, Q0.31
    output_shift: np.ndarray       # int64 per channel
    output_offset: int
    quantized_activation_min: int
    quantized_activation_max: int
    output_dtype: np.dtype
    rounding: Rounding             # which MultiplyByQuantizedMultiplier the kernel's build uses
    # float64 per channel, IN_DOUBLE only: the kernel's effective_output_scale (multiplier and shift unused)
    effective_output_scale: np.ndarray | None = None


def requantize_exact(acc: np.ndarray, p: RequantParams) -> np.ndarray:
    """The definition, in int64: acc (integers, channels last) -> output values (int64)."""
    if p.rounding is Rounding.IN_DOUBLE:
        scaled = round_in_double(np.asarray(acc, np.int64) + p.bias, p.effective_output_scale)
        return np.clip(wrap_int32(scaled + p.output_offset), p.quantized_activation_min, p.quantized_activation_max)
    scaled = multiply_by_quantized_multiplier(np.asarray(acc, np.int64) + p.bias, p.output_multiplier,
                                              p.output_shift, p.rounding)
    return np.clip(scaled + p.output_offset, p.quantized_activation_min, p.quantized_activation_max)


@dataclass(frozen=True)
class _Evaluation:
    """One candidate float evaluation: its type, form and per-channel constants."""

    float_type: type
    form: str                 # "linear" or "signed"
    scale: np.ndarray         # M'
    constant: np.ndarray      # C' (linear) or B' (signed)
    sign_step: np.ndarray | None = None  # e' (signed)
    tail: float | None = None            # 1/2 + output_offset + 256 (signed)
    int_type: type = np.int64            # holds trunc(u) over the accumulator's range

    def tiled(self, tiles: int) -> _Evaluation:
        """The same evaluation with its per-channel constants repeated `tiles` times along a row."""
        return replace(self, scale=np.tile(self.scale, tiles), constant=np.tile(self.constant, tiles),
                       sign_step=None if self.sign_step is None else np.tile(self.sign_step, tiles))


class Requantizer:
    """requantize(acc) for accumulators of a known range; evaluation chosen and proven at load."""

    def __init__(self, params: RequantParams, acc_bound: np.ndarray, acc_dtype: np.dtype, accelerate: bool = False,
                 scratch: Scratch | None = None):
        """scratch: where the float and integer temporaries live (the interpreter's; else one of its own)."""
        self.params = params
        self.offset = _BYTE_OFFSET
        self.scratch = scratch if scratch is not None else Scratch()
        channels = params.output_multiplier.size
        self.acc_high = np.broadcast_to(np.asarray(acc_bound, np.int64), (channels,)).copy()
        self.acc_low = -self.acc_high
        # the clamp, after the offset
        self.low = params.quantized_activation_min + self.offset
        self.high = params.quantized_activation_max + self.offset
        self.evaluation: _Evaluation | None = None
        points, exact = self._proof_points()
        types = ([np.float32] if np.dtype(acc_dtype) == np.float32 else []) + [np.float64]
        if not self._monotone():
            types = []  # the proof needs a monotone definition: keep the int64 one
        for float_type in types:
            for evaluation in self._candidates(float_type):
                evaluation = self._with_int_type(evaluation)
                if evaluation is not None and self._agrees(evaluation, points, exact):
                    self.evaluation = evaluation
                    break
            if self.evaluation is not None:
                break
        self._tiles: dict[int, _Evaluation] = {}
        self._row_widths: dict[int, int] = {}
        # the numba kernel repeats the float64 evaluation; other evaluations stay in numpy
        self.accelerated = bool(accelerate and self.evaluation is not None
                                and self.evaluation.float_type is np.float64)

    @property
    def strategy(self) -> str:
        """float32-linear, float64-signed, ... or int64 (the definition itself)."""
        e = self.evaluation
        return "int64" if e is None else f"{np.dtype(e.float_type).name}-{e.form}"

    def _row_width(self, size: int) -> int:
        """The row (a whole number of pixels) that `size` accumulators are requantized in, cached per size.

        The per-channel constants are tiled to it, so each numpy pass runs over rows of several
        pixels instead of one row per pixel: the same arithmetic per value, far fewer inner loops.
        The shortest row of at least ROW_VALUES values that divides the size.
        """
        width = self._row_widths.get(size)
        if width is None:
            channels = self.params.output_multiplier.size
            pixels = size // channels
            per_row = next((d for d in range(1, pixels) if pixels % d == 0 and d * channels >= ROW_VALUES), pixels)
            width = self._row_widths[size] = per_row * channels
        return width

    def _tiled(self, width: int) -> _Evaluation:
        """The evaluation with its constants along a row of `width` values (a multiple of the channels)."""
        e = self._tiles.get(width)
        if e is None:
            e = self._tiles[width] = self.evaluation.tiled(width // self.evaluation.scale.size)
        return e

    def kernel_arguments(self, width: int) -> tuple:
        """The proven float64 evaluation as arguments for app.emulator.accel's kernels, tiled to a row of width.

        The kernel clamps u in float to [low, high + 1/2] and then truncates: the same integers
        as truncating first and clamping to [low, high] (low > 0), as the numpy path does.
        """
        e = self._tiled(width)
        sign_step = e.sign_step if e.sign_step is not None else np.zeros_like(e.scale)
        return (e.scale, e.constant, sign_step, float(e.tail or 0.0), e.form == "signed", float(self.low),
                float(self.high) + 0.5)

    def _monotone(self) -> bool:
        """The definition is non-decreasing in acc unless int32 arithmetic wraps: acc + bias, or the
        left shift DOUBLE_ROUNDING applies to it for multipliers above one (x * (1 << shift) in C++),
        or IN_DOUBLE's result leaving int32 (INT32_MIN then) or wrapping when the output offset is added."""
        p = self.params
        largest = self.acc_high + np.abs(p.bias)
        if p.rounding is Rounding.IN_DOUBLE:
            scaled = largest * self._real_multiplier() + abs(p.output_offset) + 1
            return bool((largest < 2**31).all() and (scaled < 2**31).all())
        shifted = largest * np.exp2(np.maximum(p.output_shift, 0))
        return bool((largest < 2**31).all() and (shifted < 2**31).all())

    def _real_multiplier(self) -> np.ndarray:
        p = self.params
        if p.rounding is Rounding.IN_DOUBLE:
            return np.broadcast_to(np.asarray(p.effective_output_scale, np.float64), p.output_multiplier.shape)
        return p.output_multiplier.astype(np.float64) * np.exp2(p.output_shift.astype(np.float64) - 31)

    def _sign_step(self) -> np.ndarray:
        """e per channel: half the last rounding step of DOUBLE_ROUNDING's RoundingDivideByPOT; IN_DOUBLE's
        tie-break (negative ties round down)."""
        if self.params.rounding is Rounding.IN_DOUBLE:
            return np.full(self.params.output_multiplier.shape, _IN_DOUBLE_TIE_STEP)
        right_shift = np.maximum(-self.params.output_shift, 0)
        return np.where(right_shift >= 1, np.exp2(-(right_shift + 1.0)), 0.0)

    def _candidates(self, float_type):
        p = self.params
        real = self._real_multiplier()
        tail = 0.5 + p.output_offset + self.offset
        double = p.rounding is Rounding.DOUBLE_ROUNDING
        scale = real.astype(float_type)
        with np.errstate(over="ignore"):
            linear = p.bias.astype(np.float64) * real + tail + (self._sign_step() if double else 0.0)
            yield _Evaluation(float_type, "linear", scale, linear.astype(float_type))
            if p.rounding is not Rounding.SINGLE_ROUNDING:
                yield _Evaluation(float_type, "signed", scale, (p.bias.astype(np.float64) * real).astype(float_type),
                                  self._sign_step().astype(float_type), float_type(tail))

    def _with_int_type(self, evaluation: _Evaluation) -> _Evaluation | None:
        """The evaluation with the narrowest integer type holding trunc(u) on the whole accumulator range.

        u is monotone in acc, so its values at the range's ends bound it; None if they are not finite.
        """
        ends = np.stack([self.acc_low, self.acc_high]).astype(evaluation.float_type)
        with np.errstate(over="ignore", invalid="ignore"):
            u = self._unrounded(ends, evaluation)
        if not np.isfinite(u).all():
            return None
        for int_type in (np.int16, np.int32, np.int64):
            info = np.iinfo(int_type)
            if info.min - 1.0 < u.min() and u.max() < info.max + 1.0:  # trunc(u) in [min, max]
                return replace(evaluation, int_type=int_type)
        return None

    def _steps(self) -> np.ndarray:
        """Per channel, the smallest accumulator reaching each output level: int64 [channels, levels]."""
        p = self.params
        levels = np.arange(p.quantized_activation_min + 1, p.quantized_activation_max + 1, dtype=np.int64)
        real = self._real_multiplier()[:, None]
        target = (levels - p.output_offset - 0.5)[None, :]  # a * M >= target reaches the level ...
        if p.rounding is Rounding.DOUBLE_ROUNDING:  # ... less e above zero, plus e below
            target = target - self._sign_step()[:, None] * np.where(target > 0, 1.0, -1.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            guess = np.ceil(target / real) - p.bias[:, None]
        low, high = self.acc_low[:, None], self.acc_high[:, None] + 1
        guess = np.nan_to_num(guess, nan=0.0, posinf=2.0**62, neginf=-(2.0**62))
        steps = np.clip(guess, low, high).astype(np.int64)
        # exact correction: steps[c, k] = min{acc in [low, high] : f(acc) >= level k} (high if none)
        for _ in range(1000):
            too_high = (steps > low) & (self._exact(np.maximum(steps - 1, low)) >= levels)
            not_reached = (steps < high) & (self._exact(np.minimum(steps, high - 1)) < levels)
            if not too_high.any() and not not_reached.any():
                return steps
            steps = steps - too_high + not_reached
        raise AssertionError("requantization step search did not converge")

    def _exact(self, acc: np.ndarray) -> np.ndarray:
        """requantize_exact on [channels, points]."""
        return requantize_exact(acc.T, self.params).T

    def _proof_points(self) -> tuple[np.ndarray, np.ndarray]:
        """Both sides of every step, the range's ends, and around acc = -bias (where sign(a) flips)."""
        steps = self._steps()
        flip = -self.params.bias[:, None] + np.arange(-1, 2)[None, :]
        points = np.concatenate([steps - 1, steps, self.acc_low[:, None], self.acc_high[:, None], flip], axis=1)
        points = np.clip(points, self.acc_low[:, None], self.acc_high[:, None])
        return points, self._exact(points).T

    def _agrees(self, evaluation: _Evaluation, points: np.ndarray, exact: np.ndarray) -> bool:
        limit = FLOAT32_EXACT_INTEGERS if evaluation.float_type is np.float32 else 2**53
        if np.abs(points).max(initial=0) >= limit:
            return False
        with np.errstate(over="ignore", invalid="ignore"):
            ours = self._evaluate(points.T.astype(evaluation.float_type), evaluation)
        return bool(np.array_equal(ours.astype(np.int64), exact))

    def _unrounded(self, u: np.ndarray, e: _Evaluation) -> np.ndarray:
        """u from the accumulators, in place (a float array of e.float_type, channels last)."""
        np.multiply(u, e.scale, out=u)
        np.add(u, e.constant, out=u)
        if e.form == "signed":
            sign = np.sign(u, out=self.scratch.array("requantize.sign", u.shape, u.dtype))
            np.multiply(sign, e.sign_step, out=sign)
            np.add(u, sign, out=u)
            np.add(u, e.tail, out=u)
        return u

    def _evaluate(self, u: np.ndarray, e: _Evaluation, out: np.ndarray | None = None) -> np.ndarray:
        """The run-time evaluation on accumulators u (float, e.float_type, channels last; overwritten)."""
        self._unrounded(u, e)
        truncated = self.scratch.array("requantize.int", u.shape, e.int_type)
        np.copyto(truncated, u, casting="unsafe")
        # the method with bounds of the array's type: np.clip's wrapper costs ~3 us more per call
        truncated.clip(e.int_type(self.low), e.int_type(self.high), out=truncated)
        if out is None:
            out = np.empty(u.shape, self.params.output_dtype)
        np.copyto(out.view(np.uint8), truncated, casting="unsafe")  # the low byte (C casts to unsigned wrap)
        return out

    def __call__(self, acc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """acc: float accumulators (exact integers), channels last -> int8/uint8 array (into out if given).

        acc is overwritten when it is already of the evaluation's float type; a float32 acc for a
        float64 evaluation is converted into scratch instead (float32 products, float64 requantization).
        """
        if self.evaluation is None:
            result = requantize_exact(acc.astype(np.int64), self.params).astype(self.params.output_dtype)
            if out is None:
                return result
            np.copyto(out, result)
            return out
        if out is None:
            out = np.empty(acc.shape, self.params.output_dtype)
        e, rows, out_rows = self.evaluation, acc, out
        if acc.size and acc.flags.c_contiguous and out.flags.c_contiguous:
            width = self._row_width(acc.size)
            e, rows, out_rows = self._tiled(width), acc.reshape(-1, width), out.reshape(-1, width)
        if self.accelerated and acc.flags.c_contiguous and out.flags.c_contiguous:
            from app.emulator import accel

            width = rows.shape[-1]
            accel.requantize_rows(rows, *self.kernel_arguments(width), out_rows.view(np.uint8))
            return out
        if rows.dtype != e.float_type:
            converted = self.scratch.array("requantize.float", rows.shape, e.float_type)
            np.copyto(converted, rows)
            rows = converted
        self._evaluate(rows, e, out_rows)
        return out
