"""The C library's math functions (expf, tanhf, exp), called exactly as TFLite's kernels call them.

TFLite builds its 8-bit LOGISTIC, TANH and SOFTMAX tables with std::exp / std::tanh on floats,
and the runtime links the system's libm. numpy's float32 exp is a different implementation
(its own SIMD code) that can differ in the last bit, and one bit in a table entry can move a
rounded output. So the tables call the same libm function through ctypes; they hold at most
256 entries, so the per-call cost does not matter. Without a loadable libm (not a glibc
system), the float64 result rounded to float32 is used: correct to the last bit in all but
rare cases, which is what a correctly rounded libm would give.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

import numpy as np


@cache
def _libm():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    for function in ("expf", "tanhf"):
        getattr(library, function).restype = ctypes.c_float
        getattr(library, function).argtypes = [ctypes.c_float]
    library.exp.restype = ctypes.c_double
    library.exp.argtypes = [ctypes.c_double]
    return library


# Fixed: values a memo of exp holds before it starts over (1 MiB of float64 keys and values at most); a
# model's activations take a few hundred distinct values per tensor, so it never fills in practice.
MEMO_LIMIT = 1 << 16


def _apply(name: str, fallback, values) -> np.ndarray:
    """The float function on each value, called once per distinct value (by bits: NaN payloads and signed
    zeros apart): a float tail's tensors, dequantized from 8 bits, hold a few hundred distinct values."""
    values = np.asarray(values, dtype=np.float32)
    library = _libm()
    if library is None:
        return fallback(values.astype(np.float64)).astype(np.float32)
    function = getattr(library, name)
    bits, inverse = np.unique(values.reshape(-1).view(np.uint32), return_inverse=True)
    results = [function(float(v)) for v in bits.view(np.float32)]
    return np.asarray(results, dtype=np.float32)[inverse].reshape(values.shape)


def expf(values) -> np.ndarray:
    return _apply("expf", np.exp, values)


def tanhf(values) -> np.ndarray:
    return _apply("tanhf", np.tanh, values)


def exp(values, memo: dict | None = None) -> np.ndarray:
    """The double exp of each value, libm's (float64 in, float64 out).

    memo (value -> exp(value), the caller's, kept across calls) saves the libm calls for values seen
    before: a quantized model's box encodings repeat the same few hundred."""
    values = np.asarray(values, dtype=np.float64)
    library = _libm()
    if library is None:
        return np.exp(values)
    # NaNs stay apart (equal_nan=False): each keeps its own payload through exp
    distinct, inverse = np.unique(values.reshape(-1), return_inverse=True, equal_nan=False)
    if memo is None:
        memo = {}
    elif len(memo) > MEMO_LIMIT:
        memo.clear()
    keys = distinct.view(np.int64).tolist()  # by bits: NaN payloads and signed zeros apart
    results = [memo.get(key) for key in keys]
    for i, (key, value) in enumerate(zip(keys, distinct.tolist(), strict=True)):
        if results[i] is None:
            results[i] = memo[key] = library.exp(value)
    return np.array(results, dtype=np.float64)[inverse].reshape(values.shape)
