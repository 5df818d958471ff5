"""The numba kernels give the same bytes as the numpy path they stand in for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from app.emulator import Interpreter, accel
from app.emulator.fixedpoint import Rounding, quantize_multiplier
from app.emulator.requantize import Requantizer, RequantParams
from tests.emulator_cases import OP_SETTINGS, reference, run_emulator  # noqa: F401 (fixture)
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
        fast = Requantizer(params, bound, np.dtype(np.float32), accelerate=True)
        plain = Requantizer(params, bound, np.dtype(np.float32), accelerate=False)
        assert fast.accelerated and not plain.accelerated and fast.strategy == plain.strategy
        acc = rng.integers(-60_000, 60_001, (5, 7, 24)).astype(np.float32)
        np.testing.assert_array_equal(fast(acc.copy()), plain(acc.copy()))


def test_a_depthwise_layer_needing_float64_sums_stays_exact_on_both_paths(reference):
    """289 taps of 255 * 255: partial sums past 2^24 take float64, never the float32 numba kernel."""
    from tests.emulator_cases import assert_matches_reference
    from tests.tflite_builder import GraphBuilder

    g = GraphBuilder()
    x = g.tensor("x", (1, 17, 17, 2), "UINT8", scale=0.02, zero_point=0)
    weights = np.zeros((1, 17, 17, 2), np.uint8)
    weights[..., 1] = np.random.default_rng(3).integers(0, 256, (17, 17))
    w = g.tensor("w", (1, 17, 17, 2), "UINT8", scale=0.004, zero_point=255, data=weights)
    b = g.tensor("b", (2,), "INT32", scale=float(np.float32(0.02) * np.float32(0.004)), zero_point=0,
                 data=np.array([0, 1000]))
    y = g.tensor("y", (1, 1, 1, 2), "UINT8", scale=10.0, zero_point=200)
    g.op("DEPTHWISE_CONV_2D", [x, w, b], [y], "DepthwiseConv2DOptions", padding="VALID", strideH=1, strideW=1,
         depthMultiplier=1)
    model = g.build([x], [y])
    fast = Interpreter(model_content=model, accelerate=True)
    assert fast.plan.steps[0].details["accumulate"] == "float64"
    for inputs in ([np.full((1, 17, 17, 2), 255, np.uint8)],
                   [np.random.default_rng(4).integers(0, 256, (1, 17, 17, 2)).astype(np.uint8)]):
        assert run_emulator(model, inputs, True)[0].tobytes() == run_emulator(model, inputs, False)[0].tobytes()
        assert_matches_reference(reference, model, inputs)
