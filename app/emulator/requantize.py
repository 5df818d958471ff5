"""The accumulator -> int8/uint8 step of every matrix kernel, in a few float passes, proven exact at load.

What it computes, per output channel c (TFLite: acc += bias; MultiplyByQuantizedMultiplier;
+= output_offset; clamp):

    y = clamp(MultiplyByQuantizedMultiplier(acc + bias[c], m[c], s[c]) + output_offset, act_min, act_max)

Why it can be fast and exact. With M = m * 2^(s-31) (exact) and a = acc + bias:
- SINGLE_ROUNDING: MultiplyByQuantizedMultiplier(a) = floor(a * M + 1/2);
- DOUBLE_ROUNDING: it is floor(a * M + 1/2 + e * sign(a)) with e = 2^-(r+1) for a right shift
  r >= 1 (e = 0 otherwise): rounding twice pushes values away from zero by e.
Either way y is a non-decreasing step function of the integer accumulator with at most 256
steps. The float evaluations used at run time,

    linear:  u = fl(fl(acc * M') + C'),      C' = fl(bias * M + 1/2 [+ e] + output_offset + 128)
    signed:  v = fl(fl(acc * M') + B'),      u = fl(fl(v + fl(e * sign(v))) + (1/2 + output_offset + 128))
    then     y = uint8(clip(u, act_min + 128, act_max + 128.5)) ^ 0x80   (int8; uint8 adds no 128)

are non-decreasing in acc too (rounding to nearest is monotone). Two non-decreasing integer
step functions that agree at both sides of every step of one of them, and at the ends of the
accumulator's range, agree on the whole range. So at load, per channel, the exact step
positions are found with int64 arithmetic, each candidate evaluation is run at those points,
and the cheapest one that agrees everywhere is used: float32 before float64, linear before
signed. A layer where none holds keeps the int64 definition (always exact, slow). The
accumulator's range comes from the weights: |acc| <= sum |w| * max |x|.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.emulator.fixedpoint import Rounding, multiply_by_quantized_multiplier

# Offsets an int8 result into [0, 255] so a truncating cast to uint8 is a floor; xor 0x80 undoes it.
_INT8_BIAS = 128
# float32 holds every integer up to 2^24 exactly.
FLOAT32_EXACT_INTEGERS = 2**24


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


def requantize_exact(acc: np.ndarray, p: RequantParams) -> np.ndarray:
    """The definition, in int64: acc (integers, channels last) -> output values (int64)."""
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
    tail: float | None = None            # 1/2 + output_offset + 128 (signed)


class Requantizer:
    """requantize(acc) for accumulators of a known range; evaluation chosen and proven at load."""

    def __init__(self, params: RequantParams, acc_bound: np.ndarray, acc_dtype: np.dtype, period: int | None = None,
                 accelerate: bool = False):
        """period: a multiple of the channel count that divides the accumulators' size (e.g. width * channels).

        The per-channel constants are tiled to it, so each numpy pass runs over rows of `period`
        values instead of one row per pixel: the same arithmetic per element, far fewer inner loops.
        """
        self.params = params
        self.signed = np.dtype(params.output_dtype) == np.int8
        self.offset = _INT8_BIAS if self.signed else 0
        channels = params.output_multiplier.size
        self.acc_high = np.broadcast_to(np.asarray(acc_bound, np.int64), (channels,)).copy()
        self.acc_low = -self.acc_high
        self.evaluation: _Evaluation | None = None
        points, exact = self._proof_points()
        types = ([np.float32] if np.dtype(acc_dtype) == np.float32 else []) + [np.float64]
        if not self._monotone():
            types = []  # the proof needs a monotone definition: keep the int64 one
        for float_type in types:
            for evaluation in self._candidates(float_type):
                if self._agrees(evaluation, points, exact):
                    self.evaluation = evaluation
                    break
            if self.evaluation is not None:
                break
        self.period = channels if period is None or period % channels else period
        self._tiled = None
        # the numba kernel repeats the float64 evaluation; other evaluations stay in numpy
        self.accelerated = bool(accelerate and self.evaluation is not None
                                and self.evaluation.float_type is np.float64)
        if self.evaluation is not None:
            float_type = self.evaluation.float_type
            self.low = float_type(params.quantized_activation_min + self.offset)
            self.high = float_type(params.quantized_activation_max + self.offset + 0.5)
            e, tiles = self.evaluation, self.period // channels
            self._tiled = _Evaluation(e.float_type, e.form, np.tile(e.scale, tiles), np.tile(e.constant, tiles),
                                      None if e.sign_step is None else np.tile(e.sign_step, tiles), e.tail)

    @property
    def strategy(self) -> str:
        """float32-linear, float64-signed, ... or int64 (the definition itself)."""
        e = self.evaluation
        return "int64" if e is None else f"{np.dtype(e.float_type).name}-{e.form}"

    def kernel_arguments(self, width: int) -> tuple:
        """The proven float64 evaluation as arguments for app.emulator.accel's kernels, tiled to a row of width."""
        e = self.evaluation if width == self.evaluation.scale.size else self._tiled
        if e.scale.size != width:
            tiles = width // self.evaluation.scale.size
            base = self.evaluation
            e = _Evaluation(base.float_type, base.form, np.tile(base.scale, tiles), np.tile(base.constant, tiles),
                            None if base.sign_step is None else np.tile(base.sign_step, tiles), base.tail)
        sign_step = e.sign_step if e.sign_step is not None else np.zeros_like(e.scale)
        return (e.scale, e.constant, sign_step, float(e.tail or 0.0), e.form == "signed", float(self.low),
                float(self.high), np.uint8(_INT8_BIAS if self.signed else 0))

    def _monotone(self) -> bool:
        """The definition is non-decreasing in acc unless int32 arithmetic wraps: acc + bias, or the
        left shift DOUBLE_ROUNDING applies to it for multipliers above one (x * (1 << shift) in C++)."""
        p = self.params
        largest = self.acc_high + np.abs(p.bias)
        shifted = largest * np.exp2(np.maximum(p.output_shift, 0))
        return bool((largest < 2**31).all() and (shifted < 2**31).all())

    def _real_multiplier(self) -> np.ndarray:
        p = self.params
        return p.output_multiplier.astype(np.float64) * np.exp2(p.output_shift.astype(np.float64) - 31)

    def _sign_step(self) -> np.ndarray:
        """e per channel: half the last rounding step of DOUBLE_ROUNDING's RoundingDivideByPOT."""
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
            if double:
                yield _Evaluation(float_type, "signed", scale, (p.bias.astype(np.float64) * real).astype(float_type),
                                  self._sign_step().astype(float_type), float_type(tail))

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
        float_type = evaluation.float_type
        low = float_type(self.params.quantized_activation_min + self.offset)
        high = float_type(self.params.quantized_activation_max + self.offset + 0.5)
        with np.errstate(over="ignore", invalid="ignore"):
            ours = self._evaluate(points.T.astype(float_type), evaluation, low, high)
        return bool(np.array_equal(ours.astype(np.int64), exact))

    def _evaluate(self, acc: np.ndarray, e: _Evaluation, low, high, out: np.ndarray | None = None) -> np.ndarray:
        """The run-time evaluation, in place on acc (a float array of e.float_type, channels last)."""
        np.multiply(acc, e.scale, out=acc)
        np.add(acc, e.constant, out=acc)
        if e.form == "signed":
            sign = np.sign(acc)
            np.multiply(sign, e.sign_step, out=sign)
            np.add(acc, sign, out=acc)
            np.add(acc, e.tail, out=acc)
        np.clip(acc, low, high, out=acc)
        if out is None:
            out = np.empty(acc.shape, np.uint8)
        raw = out.view(np.uint8)
        np.copyto(raw, acc, casting="unsafe")
        if self.signed:
            np.bitwise_xor(raw, _INT8_BIAS, out=raw)
        return raw.view(self.params.output_dtype)

    def __call__(self, acc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """acc: float accumulators (exact integers), channels last -> int8/uint8 array (acc is overwritten)."""
        if self.evaluation is None:
            return requantize_exact(acc.astype(np.int64), self.params).astype(self.params.output_dtype)
        shape = acc.shape
        if self.accelerated and acc.flags.c_contiguous:
            from app.emulator import accel

            if out is None:
                out = np.empty(shape, np.uint8)
            raw = out.view(np.uint8)
            width = self.period if acc.size % self.period == 0 else shape[-1]
            accel.requantize_rows(acc.reshape(-1, width), *self.kernel_arguments(width), raw.reshape(-1, width))
            return raw.view(self.params.output_dtype)
        if acc.dtype != self.evaluation.float_type:  # float32 products, float64 requantization
            acc = acc.astype(self.evaluation.float_type)
        if out is None:
            out = np.empty(shape, np.uint8)
        if acc.size % self.period == 0 and acc.flags.c_contiguous:
            return self._evaluate(acc.reshape(-1, self.period), self._tiled, self.low, self.high,
                                  out.reshape(-1, self.period)).reshape(shape)
        return self._evaluate(acc, self.evaluation, self.low, self.high, out)
