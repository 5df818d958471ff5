"""Scratch: the kernels' temporary arrays, kept from one invoke to the next, one set per interpreter.

The matrix kernels' temporaries are large (a 112x112x96 layer's accumulators take 9.6 MB in
float64) and live for one step. Allocated per call, buffers that size come fresh from the
operating system each time and are paid for again in page faults; reused, they stay mapped
and warm. Each purpose names one buffer, grown to the largest request and shared by every
step (steps run one after another), so the set costs about one large layer's temporaries.
The arrays handed out are cached too: after the first invoke, a request is one dict look-up.

Only temporaries live here, never a step's output: outputs stay readable after invoke. Like
the interpreter that owns it, a Scratch is not thread-safe.
"""

from __future__ import annotations

import math

import numpy as np

_ALIGNMENT = 64  # bytes: a cache line, and a multiple of every item size


class Scratch:
    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._arrays: dict[tuple, np.ndarray] = {}

    def array(self, purpose: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialised C-contiguous array over the buffer of `purpose`.

        Arrays of one purpose share memory: a caller holds at most one of them at a time.
        """
        key = (purpose, shape, dtype)
        array = self._arrays.get(key)
        if array is not None:
            return array
        itemsize = np.dtype(dtype).itemsize
        size = math.prod(shape) * itemsize
        buffer = self._buffers.get(purpose)
        if buffer is None or buffer.size < size + _ALIGNMENT:
            buffer = self._buffers[purpose] = np.empty(size + _ALIGNMENT, np.uint8)
            self._arrays = {k: v for k, v in self._arrays.items() if k[0] != purpose}  # over the old buffer
        start = -buffer.ctypes.data % _ALIGNMENT
        array = self._arrays[key] = buffer[start:start + size].view(dtype).reshape(shape)
        return array
