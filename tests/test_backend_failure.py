"""A backend that cannot run a model leaves it degraded on that backend only (app/registry/loading.py).

The model serves on the other backends; its status is "degraded" with one line per backend saying why; a
request naming that backend is told why (422, as for any backend a model is not served on); /readyz answers
200 while every model serves somewhere; the model is "failed" only when no backend serves it; a reload that
fixes it brings the backend back. The Edge TPU plug-in's own policy still decides for its backend
(tests/test_edgetpu_registry.py: EDGETPU_SERVE_EDGETPU_ON_FAILURE=fail fails the model).

The model the emulator cannot run is built here: the tiny colour classifier with its probabilities passed
through SIN (monotonic on [0, 1], so the classes keep their order), an operator TFLite's CPU kernels run and
the emulator, an int8 executor, does not (and is not meant to). A TEST DOUBLE backend whose interpreters
refuse with a message over several lines shows the reason kept to one line whatever a backend says.
"""

from __future__ import annotations

import asyncio
import io

import flatbuffers
import httpx
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from PIL import Image

from app.emulator.plan import supported_opcodes
from app.engines import Backend, register, unregister
from app.engines.cpu import CpuEngine
from app.errors import BackendNotAvailable, EngineLoadError
from app.registry import Registry
from app.settings import Settings
from converter.model_dir import write_model_dir
from tests.classifier_models import tiny_classifier
from tests.conftest import Service

REFUSED_OP = "SIN"
NAME = "colours_sin"
LABELS = "red\ngreen\nblue\nred2\n"


def with_sin(model: bytes) -> bytes:
    """`model` with its (quantized) output dequantized and passed through SIN: a float output of the same shape."""
    graph_model = schema.ModelT.InitFromPackedBuf(model, 0)
    graph = graph_model.subgraphs[0]

    def opcode(builtin: int) -> int:
        for index, code in enumerate(graph_model.operatorCodes):
            if code.builtinCode == builtin:
                return index
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = builtin
        code.version = 1
        graph_model.operatorCodes.append(code)
        return len(graph_model.operatorCodes) - 1

    def float_tensor(name: str, shape: list[int]) -> int:
        tensor = schema.TensorT()
        tensor.name, tensor.shape, tensor.type, tensor.buffer = name, shape, schema.TensorType.FLOAT32, 0
        graph.tensors.append(tensor)
        return len(graph.tensors) - 1

    output = graph.outputs[0]
    shape = list(graph.tensors[output].shape)
    dequantized, sines = float_tensor("probabilities/float", shape), float_tensor("scores", shape)
    for builtin, source, target in ((schema.BuiltinOperator.DEQUANTIZE, output, dequantized),
                                    (getattr(schema.BuiltinOperator, REFUSED_OP), dequantized, sines)):
        operator = schema.OperatorT()
        operator.opcodeIndex, operator.inputs, operator.outputs = opcode(builtin), [source], [target]
        graph.operators.append(operator)
    graph.outputs = [sines]
    builder = flatbuffers.Builder(1024)
    builder.Finish(graph_model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def colour_model_dir(root, model: bytes, name: str = NAME):
    manifest = {"name": name, "task": "classification", "source": "built by tests/test_backend_failure.py",
                "licence": "MIT", "input": {"width": 16, "height": 16, "resize": "stretch", "mean": [0, 0, 0],
                                            "std": [255] * 3}}
    return write_model_dir(root, manifest, {"int8": (f"{name}_int8.tflite", model),
                                            "labels": ("labels.txt", LABELS.encode())})


def red_png() -> bytes:
    pixels = np.zeros((16, 16, 3), np.uint8)
    pixels[..., 0] = 255
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def sin_model() -> bytes:
    assert REFUSED_OP not in supported_opcodes(), (
        f"the emulator runs {REFUSED_OP} now: build the model with another operator it refuses")
    return with_sin(tiny_classifier(style="tf1"))


def registry_for(root, backends=("cpu", "emulated")) -> Registry:
    registry = Registry(Settings(model_dir=root, backends=list(backends), workers=1))
    registry.configure()
    registry.load_all()
    return registry


async def classify_on(registry: Registry, backend: str | None) -> tuple[str, int]:
    """One run through a lease, as the core makes it: the backend that served it and the top class."""
    async with registry.ticket(NAME, backend) as ticket:
        x = np.zeros(ticket.input.shape, np.uint8)
        x[..., 0] = 255
        result = await ticket.run(x)
        return ticket.backend, int(np.argmax(result.outputs[0]))


def test_a_model_the_emulator_cannot_run_serves_on_cpu_and_is_degraded_on_emulated(tmp_path, sin_model):
    colour_model_dir(tmp_path, sin_model)
    registry = registry_for(tmp_path)
    try:
        status = registry.status(NAME)
        assert status.state == "degraded" and registry.ready()
        assert "\n" not in status.error
        assert status.error.startswith("emulated: not served: ") and REFUSED_OP in status.error  # the emulator's why
        assert "ask for it on the `cpu` backend" in status.error and status.error.endswith("; served on cpu")
        version = registry.get(NAME)
        assert list(version.pools) == ["cpu"]
        with pytest.raises(BackendNotAvailable,
                           match=f"cannot be served on 'emulated': .*{REFUSED_OP}.*; ask with backend=cpu$"):
            version.pool("emulated")
        assert asyncio.run(classify_on(registry, None)) == ("cpu", 0)  # red
        assert asyncio.run(classify_on(registry, "cpu")) == ("cpu", 0)
        with pytest.raises(BackendNotAvailable, match=REFUSED_OP):
            asyncio.run(classify_on(registry, "emulated"))
    finally:
        registry.close()


def test_a_request_naming_no_backend_goes_to_the_first_that_serves_the_model(tmp_path, sin_model):
    colour_model_dir(tmp_path, sin_model)
    registry = registry_for(tmp_path, backends=("emulated", "cpu"))  # the default backend is the one that cannot
    try:
        assert registry.status(NAME).state == "degraded" and registry.ready()
        assert asyncio.run(classify_on(registry, None)) == ("cpu", 0)
    finally:
        registry.close()


def test_the_model_fails_only_when_no_backend_serves_it(tmp_path, sin_model):
    colour_model_dir(tmp_path, sin_model)
    registry = registry_for(tmp_path, backends=("emulated",))
    try:
        status = registry.status(NAME)
        assert status.state == "failed" and REFUSED_OP in status.error
        assert not registry.ready()
    finally:
        registry.close()


def test_a_reload_that_fixes_it_brings_the_backend_back(tmp_path, sin_model):
    colour_model_dir(tmp_path, sin_model)
    registry = registry_for(tmp_path)
    try:
        assert registry.status(NAME).state == "degraded"
        colour_model_dir(tmp_path, tiny_classifier(style="tf1"))  # the same classifier without SIN
        fresh = registry.reload(NAME)
        assert sorted(fresh.pools) == ["cpu", "emulated"] and fresh.fallbacks == {}
        assert registry.status(NAME).state == "ready" and registry.status(NAME).error is None
        colour_model_dir(tmp_path, sin_model)  # broken again: the reload swaps in a version degraded on emulated
        assert list(registry.reload(NAME).pools) == ["cpu"]
        assert registry.status(NAME).state == "degraded"
    finally:
        registry.close()


class RefusingEngineDouble(CpuEngine):
    """TEST DOUBLE engine: refuses every model, with a runtime's account over several lines."""

    key = "refusing"

    @classmethod
    def load(cls, path, options):
        raise EngineLoadError(f"cannot load {path.name}:\n  Node number 3 (SIN) failed to prepare.\n\n"
                              "  Encountered unresolved custom op.")


class RefusingBackendDouble(Backend):
    """TEST DOUBLE plug-in whose interpreters refuse every model; by default policy, the model is degraded on it."""

    key = "refusing"
    engine = RefusingEngineDouble


@pytest.fixture
def refusing():
    register(RefusingBackendDouble)
    yield RefusingBackendDouble
    unregister(RefusingBackendDouble.key)


def test_the_reason_is_one_line_per_backend_whatever_the_backend_says(tmp_path, refusing):
    colour_model_dir(tmp_path, tiny_classifier(style="tf1"))
    registry = registry_for(tmp_path, backends=("refusing", "cpu"))
    try:
        status = registry.status(NAME)
        assert status.state == "degraded" and registry.ready()
        assert status.error == (f"refusing: not served: cannot load {NAME}_int8.tflite: Node number 3 (SIN) failed "
                                "to prepare. Encountered unresolved custom op; served on cpu")
        assert str(tmp_path) not in status.error
        assert list(registry.get(NAME).pools) == ["cpu"]
    finally:
        registry.close()


def test_over_a_socket_readyz_is_200_and_the_model_serves_on_cpu_with_emulated_degraded(tmp_path, sin_model):
    colour_model_dir(tmp_path, sin_model)
    env = {"EDGETPU_SERVE_MODEL_DIR": str(tmp_path), "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
           "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        model = ready.json()["models"][NAME]
        assert model["state"] == "degraded" and "\n" not in model["error"]
        assert model["error"].startswith("emulated: not served: ") and REFUSED_OP in model["error"]

        answer = client.post("/v1/classify", files={"image": red_png()})
        assert answer.status_code == 200, answer.text
        assert answer.json()["backend"] == "cpu" and answer.json()["predictions"][0]["label"] == "red"
        refused = client.post("/v1/classify?backend=emulated", files={"image": red_png()})
        assert refused.status_code == 422, refused.text
        assert "cannot be served on 'emulated'" in refused.json()["error"] and REFUSED_OP in refused.json()["error"]
        assert refused.json()["error"].endswith("ask with backend=cpu")  # the backend that serves it

        listed = client.get(f"/v1/models/{NAME}").json()
        assert listed["state"] == "degraded" and list(listed["backends"]) == ["cpu"]
