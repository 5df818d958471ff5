"""uint8 pixels -> the model's input tensor: model.json's normalisation, then the tensor's own quantization, rounded
as the model's maker's tools round it."""

from __future__ import annotations

import numpy as np

from app.model_dir.schema import ULTRALYTICS, InputSpec


class InputQuantizer:
    """uint8 pixels -> input tensor (1, H, W, C) of the engine's dtype.

    real = (pixel - mean) / std is what the network expects; a quantized input holds
    q = real / scale + zero_point, rounded and clamped to its dtype: by Coral's convention half away from zero, as
    TFLite's QUANTIZE does; by Ultralytics' toward zero, in float32, as its AutoBackend feeds an integer TFLite
    input (`(im / scale + zero_point).astype(dtype)`, im = pixels / 255 in float32). An 8-bit input without
    quantization (scale 0: MoveNet's uint8 input, which the model casts to float itself) holds real, rounded and
    clamped. Pixels are 8-bit, so the whole map is a 256-entry table per channel, computed once. When that table is
    the identity (uint8 input with scale = 1/std and zero_point = mean), pixels go in as they are.
    """

    def __init__(self, spec: InputSpec, dtype: np.dtype, scale: float, zero_point: int):
        self.dtype = np.dtype(dtype)
        channels = spec.channels
        mean = np.broadcast_to(np.asarray(spec.mean, np.float64), (channels,))
        std = np.broadcast_to(np.asarray(spec.std, np.float64), (channels,))
        pixel = np.arange(256, dtype=np.float64)[:, None]
        real = (pixel - mean) / std  # (256, C)
        if self.dtype == np.float32:
            self.table = real.astype(np.float32)
        else:
            if scale <= 0 and self.dtype.itemsize != 1:
                raise ValueError(f"quantized input needs a positive scale, got {scale}")
            if scale <= 0:  # not quantized: the tensor holds the values themselves
                scale, zero_point = 1.0, 0
            info = np.iinfo(self.dtype)
            if spec.maker == ULTRALYTICS:
                q = truncated(real, scale, zero_point)
            else:
                # round half away from zero, as TFLite's Quantize kernel does.
                scaled = real / scale
                q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + zero_point
            self.table = np.clip(q, info.min, info.max).astype(self.dtype)
        identity = np.arange(256)[:, None]
        self.is_identity = self.dtype == np.uint8 and bool(np.all(self.table == identity))
        self.channels = channels

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        if self.is_identity:
            out = pixels
        elif self.channels == 1:
            out = self.table[:, 0][pixels]
        else:
            out = np.empty(pixels.shape, self.table.dtype)
            for c in range(self.channels):
                np.take(self.table[:, c], pixels[:, :, c], out=out[:, :, c])
        return out[None, ...]


def truncated(real: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Ultralytics' quantization of real values: float32 real / scale + zero_point, truncated toward zero (numpy's
    astype), float64 of the whole numbers. Out of the dtype's range numpy's cast is undefined; the caller clamps."""
    values = np.asarray(real, np.float32) / np.float32(scale) + np.float32(zero_point)
    return np.trunc(values).astype(np.float64)
