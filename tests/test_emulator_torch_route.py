"""Models of the PyTorch converter route (int8 I/O, ai-edge-quantizer's op versions) on the emulator.

The three files in tests/torch_route/ were made by litert-torch + ai-edge-quantizer static_wi8_ai8
(tests/torch_route/make_models.py says how). Every tensor the emulator produces must equal
BUILTIN_REF's, and the `emulated` engine must describe their int8 input and output exactly as
the `cpu` engine does. A graph ending in DEQUANTIZE gives a float output, which the service
reads with scale 0 (app/tasks/classify.py: scores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.emulator import Interpreter
from app.engines import EngineOptions
from app.engines.cpu import CpuEngine
from app.engines.emulated import EmulatedEngine
from app.tflite_file import read_tflite
from tests.emulator_cases import random_values, reference  # noqa: F401 (fixture)
from tests.tflite_builder import GraphBuilder

ROUTE = Path(__file__).parent / "torch_route"
MODELS = ["clean", "mixed", "v3ish"]


def _path(name: str) -> Path:
    return ROUTE / f"{name}_int8.tflite"


@pytest.mark.parametrize("name", MODELS)
def test_every_tensor_is_identical_to_builtin_ref(reference, name):
    model = _path(name).read_bytes()
    interpreter = Interpreter(model_content=model)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    assert detail["dtype"] == np.int8 and interpreter.get_output_details()[0]["dtype"] == np.int8
    for seed in range(2):
        x = random_values(seed, tuple(detail["shape"]), "INT8")
        expected = reference.run(model, [x], all_tensors=True)
        interpreter.set_tensor(detail["index"], x)
        interpreter.invoke()
        for step in interpreter.plan.steps:
            for index in step.outputs:
                assert interpreter.get_tensor(index).tobytes() == expected[index].tobytes(), \
                    f"#{step.operator.index} {step.operator.opcode}"
        assert len(np.unique(expected[interpreter.model.graph.outputs[0]])) > 3  # not a collapsed model


def test_the_files_carry_the_quantizers_op_versions_and_the_cpu_side_ops():
    versions = {(op.opcode, op.version) for name in MODELS for op in read_tflite(_path(name)).graph.operators}
    assert {("CONV_2D", 1), ("FULLY_CONNECTED", 5), ("TRANSPOSE_CONV", 3)} <= versions
    opcodes = {opcode for opcode, _ in versions}
    assert {"PAD", "HARD_SWISH", "LEAKY_RELU", "DEQUANTIZE", "QUANTIZE", "TRANSPOSE_CONV", "TRANSPOSE",
            "GATHER_ND"} <= opcodes


@pytest.mark.parametrize("name", MODELS)
def test_the_emulated_engine_serves_int8_io_as_the_cpu_engine_does(reference, name):
    path = _path(name)
    emulated, cpu = EmulatedEngine.load(path, EngineOptions()), CpuEngine.load(path, EngineOptions())
    assert emulated.inputs == cpu.inputs and emulated.outputs == cpu.outputs
    (inp,), (out,) = emulated.inputs, emulated.outputs
    assert inp.dtype == np.int8 and out.dtype == np.int8 and out.scale > 0
    x = random_values(5, inp.shape, "INT8")
    (expected,) = reference.run(path.read_bytes(), [x])
    assert emulated.run([x])[0].tobytes() == expected.tobytes()
    emulated.close()
    cpu.close()


def _dequantized_head() -> bytes:
    """int8 features -> FULLY_CONNECTED (v5, the quantizer's) -> DEQUANTIZE -> float32 logits."""
    rng = np.random.default_rng(3)
    g = GraphBuilder()
    x = g.tensor("features", (1, 32), "INT8", scale=0.05, zero_point=-4)
    scales = rng.uniform(0.002, 0.01, 10).astype(np.float32)
    w = g.tensor("w", (10, 32), "INT8", scale=scales, zero_point=[0] * 10, data=rng.integers(-127, 128, (10, 32)))
    b = g.tensor("b", (10,), "INT32", scale=np.float32(0.05) * scales, zero_point=[0] * 10,
                 data=rng.integers(-400, 400, 10))
    q = g.tensor("logits_int8", (1, 10), "INT8", scale=0.06, zero_point=2)
    g.op("FULLY_CONNECTED", [x, w, b], [q], "FullyConnectedOptions", version=5)
    y = g.tensor("logits", (1, 10), "FLOAT32")
    g.op("DEQUANTIZE", [q], [y], version=2)
    return g.build([x], [y])


def test_a_float_output_after_dequantize_has_scale_zero_on_both_engines(reference, tmp_path):
    path = tmp_path / "head.tflite"
    path.write_bytes(_dequantized_head())
    emulated, cpu = EmulatedEngine.load(path, EngineOptions()), CpuEngine.load(path, EngineOptions())
    assert emulated.outputs == cpu.outputs
    (out,) = emulated.outputs
    assert out.dtype == np.float32 and out.scale == 0.0 and out.zero_point == 0
    x = random_values(9, (1, 32), "INT8")
    (expected,) = reference.run(path.read_bytes(), [x])
    (got,) = emulated.run([x])
    assert got.dtype == np.float32 and got.tobytes() == expected.tobytes()
    assert len(np.unique(got)) > 3
    emulated.close()
    cpu.close()
