"""What the emulator's per-op tests share: random quantized tensors, and the comparison with TFLite.

Every example is a small model built with tests/tflite_builder.py and run twice: by the emulator
here, and by the real interpreter (BUILTIN_REF) in the reference worker subprocess. Outputs must
be byte-identical. An example the reference aborts on or refuses is not a pass: hypothesis
discards it (assume), and a test whose examples are mostly discarded fails its health check.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, note, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st

from app.emulator import Interpreter
from tests.reference_worker import Aborted, ReferenceWorker, Refused

DTYPES = {"INT8": np.int8, "UINT8": np.uint8}
# Deterministic in CI (derandomize) and sized so all emulator tests stay within a few minutes on 2 cores;
# EMULATOR_EXAMPLES=1000 (and EMULATOR_RANDOM=1 for new examples each run) searches deeper by hand.
OP_SETTINGS = settings(max_examples=int(os.environ.get("EMULATOR_EXAMPLES", "60")),
                       derandomize=not os.environ.get("EMULATOR_RANDOM"), deadline=None, print_blob=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="session")
def reference():
    worker = ReferenceWorker("BUILTIN_REF")
    yield worker
    worker.close()


class Case:
    """One example: the model, its inputs, and what it is (hypothesis prints this when it fails)."""

    def __init__(self, model: bytes, inputs: list, description: str):
        self.model, self.inputs, self.description = model, inputs, description

    def __repr__(self) -> str:
        return self.description


def case(model: bytes, inputs: list, **parameters) -> Case:
    return Case(model, inputs, ", ".join(f"{k}={v!r}" for k, v in parameters.items()))


def run_emulator(model: bytes, inputs: list[np.ndarray], accelerate: bool | None = None) -> list[np.ndarray]:
    interpreter = Interpreter(model_content=model, accelerate=accelerate)
    interpreter.allocate_tensors()
    for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
        interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def assert_matches_reference(reference: ReferenceWorker, model: bytes | Case, inputs: list | None = None) -> None:
    if isinstance(model, Case):
        note(model.description)
        model, inputs = model.model, model.inputs
    expected = reference.run(model, inputs)
    if isinstance(expected, (Aborted, Refused)):
        if currently_in_test_context():  # a degenerate random model: discard the example, it is no pass
            assume(False)
        raise AssertionError(f"BUILTIN_REF did not run the model: {expected}")
    ours = run_emulator(model, inputs)
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        if got.tobytes() != want.tobytes():  # bytes: float outputs must match to the sign of zero
            unequal = (got != want) | (np.signbit(got) != np.signbit(want))
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            raise AssertionError(f"{np.count_nonzero(unequal)} of {got.size} values differ from BUILTIN_REF "
                                 f"(max |diff| {diff.max()}); first at {np.argwhere(unequal)[0].tolist()}")


# ---- strategies ----

type_names = st.sampled_from(["INT8", "UINT8"])


@st.composite
def quantization(draw, type_name: str, scale_low: float = 1e-3, scale_high: float = 0.5) -> tuple[float, int]:
    """A scale (log-uniform) and a zero point inside the type's range."""
    scale = float(np.float32(np.exp(draw(st.floats(np.log(scale_low), np.log(scale_high))))))
    info = np.iinfo(DTYPES[type_name])
    zero_point = draw(st.integers(int(info.min), int(info.max)))
    return scale, zero_point


def random_values(seed: int, shape, type_name: str) -> np.ndarray:
    info = np.iinfo(DTYPES[type_name])
    rng = np.random.default_rng(seed)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(DTYPES[type_name])


seeds = st.integers(0, 2**31 - 1)
activations = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])


def every_byte(seed: int, shape, type_name: str) -> np.ndarray:
    """Random values of an 8-bit type that include all 256 of them when the shape has room."""
    values = random_values(seed, shape, type_name).reshape(-1)
    count = min(values.size, 256)
    values[:count] = np.random.default_rng(seed).permutation(np.arange(256, dtype=np.uint8))[:count].view(
        DTYPES[type_name])
    return np.random.default_rng(seed + 1).permutation(values).reshape(shape)


NUMPY = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
         "FLOAT32": np.float32, "BOOL": np.bool_}
SPECIAL_FLOATS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 0.5, -0.5,
                           1.5, -2.5], np.float32)


def values_of(seed: int, shape, type_name: str, special: bool = True, low: float = -100.0,
              high: float = 100.0) -> np.ndarray:
    """Random values of any tensor type: every byte for 8-bit types, the extremes among integers, and for
    float32 a mix of uniform values in [low, high), small integers (ties) and, with special, signed zeros,
    infinities, NaN and subnormals."""
    if type_name in DTYPES:
        return every_byte(seed, shape, type_name)
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if type_name == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if type_name != "FLOAT32":
        info = np.iinfo(NUMPY[type_name])
        values = rng.integers(-1000, 1001, size=size).astype(NUMPY[type_name])
        extremes = np.array([info.min, info.max, 0, -1, 1], NUMPY[type_name])
        count = min(size // 4, extremes.size)
        values[rng.permutation(size)[:count]] = extremes[:count]
        return values.reshape(shape)
    values = rng.uniform(low, high, size).astype(np.float32)
    ties = rng.random(size) < 0.25
    values[ties] = np.round(values[ties] / 8)
    if special and size:
        count = min(size // 4, SPECIAL_FLOATS.size)
        values[rng.permutation(size)[:count]] = rng.permutation(SPECIAL_FLOATS)[:count]
    return values.reshape(shape)


@st.composite
def shapes(draw, min_rank: int = 1, max_rank: int = 4, max_side: int = 9) -> tuple[int, ...]:
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(1, max_side)) for _ in range(rank))


def unary_model(opcode: str, shape, type_name: str, input_q, output_q, options: str | None = None,
                output_type: str | None = None, version: int = 1, **fields) -> bytes:
    from tests.tflite_builder import GraphBuilder

    g = GraphBuilder()
    x = g.tensor("input", shape, type_name, scale=input_q[0], zero_point=input_q[1])
    out_type = output_type or type_name
    if out_type == "FLOAT32":
        y = g.tensor("output", shape, out_type)
    else:
        y = g.tensor("output", shape, out_type, scale=output_q[0], zero_point=output_q[1])
    g.op(opcode, [x], [y], options, version=version, **fields)
    return g.build([x], [y])
