"""The `emulated` backend: the engine, the registry with it, and the service on a real socket."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from app.emulator import UnsupportedOperators
from app.engines import ENGINES, EngineOptions
from app.engines.cpu import CpuEngine
from app.engines.emulated import EmulatedEngine
from app.errors import EngineLoadError
from app.tasks.classify import scores
from app.model_dir.reading import read_model_dir
from app.registry import Registry
from app.settings import Settings
from app.tflite_file import read_tflite
from tests.conftest import DEFAULT_MODEL, MODELS, Service
from tests.emulator_cases import reference  # noqa: F401 (fixture)
from tests.test_emulator_interpreter import MODEL, PHOTOS, photo_tensor
from tests.tflite_builder import GraphBuilder

CAT_CLASSES = {281, 282, 285}  # tabby, tiger cat, Egyptian cat


def test_registered_under_its_key():
    assert ENGINES["emulated"] is EmulatedEngine
    assert EmulatedEngine.model_file == CpuEngine.model_file  # the same int8 file as cpu


def test_engine_runs_the_model_bit_exactly(reference):
    engine = EmulatedEngine.load(MODEL, EngineOptions())
    cpu = CpuEngine.load(MODEL, EngineOptions())
    assert engine.inputs == cpu.inputs and engine.outputs == cpu.outputs
    x = photo_tensor(*PHOTOS[1])
    (expected,) = reference.run(MODEL.read_bytes(), [x])
    (out,) = engine.run([x])
    np.testing.assert_array_equal(out, expected)
    out[...] = 0  # the caller gets a copy, not the interpreter's tensor
    np.testing.assert_array_equal(engine.run([x])[0], expected)
    assert engine.interpreter.model.graph.operators[1].opcode == "CONV_2D"  # the parsed graph, for analyses
    engine.close()


def test_a_model_it_cannot_run_fails_the_load_with_the_operators(tmp_path):
    g = GraphBuilder()
    x = g.tensor("x", (1, 4), "INT8", scale=0.1, zero_point=0)
    g.op("REVERSE_V2", [x, g.constant("axis", [1])], [g.tensor("y", (1, 4), "INT8", scale=0.1, zero_point=0)])
    path = tmp_path / "reverse.tflite"
    path.write_bytes(g.build([x], [2]))
    with pytest.raises(EngineLoadError, match=r"REVERSE_V2 \(operator 0\) not emulated") as raised:
        EmulatedEngine.load(path, EngineOptions())
    assert isinstance(raised.value, UnsupportedOperators)


def test_the_parsed_graph_is_offered_for_analyses_of_the_model():
    """Plug-ins analyse the graph the emulator parsed (the Edge TPU's: tests/test_edgetpu_describe.py)."""
    engine = EmulatedEngine.load(MODEL, EngineOptions())
    assert engine.parsed_model is engine.interpreter.model
    assert len(engine.parsed_model.graph.operators) == 62
    assert CpuEngine.load(MODEL, EngineOptions()).parsed_model is None  # the TFLite runtime parses its own


def test_registry_serves_cpu_and_emulated_side_by_side(tmp_path):
    import shutil

    shutil.copytree(MODELS / DEFAULT_MODEL, tmp_path / DEFAULT_MODEL)
    registry = Registry(Settings(model_dir=tmp_path, workers=1, backends=["cpu", "emulated"]))
    registry.configure()
    registry.load_all()
    assert registry.ready()
    model = registry.get(DEFAULT_MODEL)
    pool = model.pool("emulated")
    assert pool.members.warm and pool.members.load_ms > 0 and pool.members.first_inference_ms > 0
    assert pool.members.inputs[0].dtype == np.uint8  # the image goes in quantized to uint8 (app/core/images.py ImageWork)
    registry.close()


@pytest.fixture(scope="module")
def emulated_service():
    service = Service({"EDGETPU_SERVE_BACKENDS": "cpu,emulated", "EDGETPU_SERVE_WORKERS": "1"})
    service.wait_ready()
    yield service
    service.stop()


def test_service_classifies_on_the_emulator_over_http(emulated_service, reference, cat_png):
    with httpx.Client(base_url=emulated_service.url, timeout=60) as client:
        response = client.post("/v1/classify", params={"backend": "emulated", "top_k": 5},
                               files={"image": ("chelsea.png", cat_png.read_bytes(), "image/png")})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["backend"] == "emulated"
        assert {p["index"] for p in body["predictions"]} & CAT_CLASSES
        assert set(body["timing_ms"]) == {"decode", "preprocess", "queue", "inference", "postprocess", "total"}
        assert body["warmup"]["load_ms"] > 0 and body["warmup"]["first_inference_ms"] > 0

        # the same photo through the same preprocessing, on BUILTIN_REF in the reference worker
        (expected,) = reference.run(MODEL.read_bytes(), [photo_tensor(*PHOTOS[0])])
        model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
        output = read_tflite(MODEL).graph
        quantization = output.tensors[output.outputs[0]].quantization
        reference_scores = scores(expected, float(quantization.scale[0]), int(quantization.zero_point[0]), model_dir)
        for prediction in body["predictions"]:
            assert prediction["score"] == pytest.approx(reference_scores[prediction["index"]], rel=1e-12)
        top5 = np.argsort(-reference_scores, kind="stable")[:5].tolist()
        assert [p["index"] for p in body["predictions"]] == top5

        detail = client.get(f"/v1/models/{DEFAULT_MODEL}").json()
        emulated = detail["backends"]["emulated"]
        assert emulated["warm"] is True and emulated["input"] == detail["backends"]["cpu"]["input"]
        view = emulated["edgetpu_view"]
        assert view["mapped"] == view["total"] == 62 and view["first_unsupported"] is None
        assert view["summary"] == "all 62 ops would run on the Edge TPU"
        assert all(op["on_edgetpu"] and op["supported"] for op in view["ops"])
        assert detail["backends"]["cpu"]["edgetpu_view"] is None
        default = client.post("/v1/classify", files={"image": ("chelsea.png", cat_png.read_bytes(), "image/png")})
        assert default.json()["backend"] == "cpu"  # the first configured backend stays the default
