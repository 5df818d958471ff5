"""The numba kernels give the same bytes as the numpy path they stand in for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from app.emulator import Interpreter, accel
from app.emulator.fixedpoint import Rounding, quantize_multiplier
from app.emulator.requantize import Requantizer, RequantParams
from tests.emulator_cases import OP_SETTINGS, run_emulator
from tests.test_emulator_conv import conv_models, depthwise_models
from tests.test_emulator_interpreter import MODEL, PHOTOS, photo_tensor, run


def test_numba_is_there_and_can_be_switched_off(monkeypatch):
    assert accel.available()  # installed with the dev extra: CI runs both paths
    monkeypatch.setenv(accel.DISABLE_VARIABLE, "0")
    assert not accel.available()
    assert Interpreter(model_path=MODEL).accelerated is False


def _same_bytes(example) -> list[bool]:
    fast = run_emulator(example.model, example.inputs, accelerate=True)
    plain = run_emulator(example.model, example.inputs, accelerate=False)
    return [a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(fast, plain, strict=True)]


@OP_SETTINGS
@given(depthwise_models())
def test_depthwise_kernel_equals_numpy(example):
    assert all(_same_bytes(example))


@settings(OP_SETTINGS, max_examples=30)
@given(conv_models())
def test_requantization_kernel_equals_numpy_in_convolutions(example):
    assert all(_same_bytes(example))


def test_default_model_takes_the_kernels_and_gives_the_same_bytes():
    fast = Interpreter(model_path=MODEL, accelerate=True)
    plain = Interpreter(model_path=MODEL, accelerate=False)
    assert fast.accelerated and not plain.accelerated
    accelerated = [s.details.get("accelerated") for s in fast.plan.steps if "accelerated" in s.details]
    assert accelerated and all(accelerated)
    assert not any(s.details.get("accelerated") for s in plain.plan.steps)
    for interpreter in (fast, plain):
        interpreter.allocate_tensors()
    for package, name in PHOTOS[:2]:
        x = photo_tensor(package, name)
        assert run(fast, x).tobytes() == run(plain, x).tobytes()
        for index in range(len(fast.model.graph.tensors)):
            assert fast.get_tensor(index).tobytes() == plain.get_tensor(index).tobytes(), index


def test_requantize_rows_signed_and_linear_forms():
    rng = np.random.default_rng(5)
    for rounding, low in ((Rounding.DOUBLE_ROUNDING, -128), (Rounding.DOUBLE_ROUNDING, 0), (Rounding.SINGLE_ROUNDING, -128)):
        pairs = [quantize_multiplier(m) for m in rng.uniform(1e-4, 1e-2, 24)]
        params = RequantParams(bias=rng.integers(-9000, 9000, 24), output_multiplier=np.array([p[0] for p in pairs]),
                               output_shift=np.array([p[1] for p in pairs]), output_offset=-3,
                               quantized_activation_min=low, quantized_activation_max=127,
                               output_dtype=np.dtype(np.int8), rounding=rounding)
        bound = np.full(24, 60_000)
        fast = Requantizer(params, bound, np.dtype(np.float32), period=24 * 7, accelerate=True)
        plain = Requantizer(params, bound, np.dtype(np.float32), period=24 * 7, accelerate=False)
        assert fast.accelerated and not plain.accelerated and fast.strategy == plain.strategy
        acc = rng.integers(-60_000, 60_001, (5, 7, 24)).astype(np.float32)
        np.testing.assert_array_equal(fast(acc.copy()), plain(acc.copy()))
