"""What the Edge TPU plug-in adds to GET /v1/models through the generic hooks: the compiler's view
of a graph another backend parsed (the emulator's), and model.json's estimated latency. The keys
and values are those /v1/models served before the core stopped naming the Edge TPU."""

from __future__ import annotations

import dataclasses

import numpy as np
from fastapi.testclient import TestClient

from app.edgetpu.compat import analyze
from app.engines import Backend, EngineOptions, TensorSpec, register, unregister
from app.engines.cpu import CpuEngine
from app.engines.edgetpu import EdgeTpuBackend
from app.engines.emulated import EmulatedEngine
from app.main import create_app
from app.api.deps import service_of
from app.model_dir.reading import read_model_dir
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.test_emulator_interpreter import MODEL
from tests.tflite_builder import GraphBuilder


def _plugin() -> EdgeTpuBackend:
    return EdgeTpuBackend(Settings(model_dir=MODELS))


def _rendered(report) -> dict:
    """The analysis as /v1/models has always shown it: the report's rendering without `compiled`."""
    return {key: value for key, value in report.to_dict().items() if key != "compiled"}


def test_the_view_says_which_ops_the_edgetpu_would_run(tmp_path):
    g = GraphBuilder()
    x, a, b, y = (g.tensor(n, (1, 8), "INT8", scale=0.05, zero_point=0) for n in ("x", "a", "b", "y"))
    g.op("RELU", [x], [a])
    g.op("HARD_SWISH", [a], [b])  # the emulator runs it; the Edge TPU's table has no HARD_SWISH
    g.op("RELU", [b], [y])
    path = tmp_path / "hard_swish.tflite"
    path.write_bytes(g.build([x], [y]))
    engine = EmulatedEngine.load(path, EngineOptions())
    view = _plugin().describe_backend("emulated", engine, None)["edgetpu_view"]
    assert view["summary"] == "first unsupported op: HARD_SWISH at index 1; 1 of 3 ops would run on the Edge TPU"
    assert [op["on_edgetpu"] for op in view["ops"]] == [True, False, False]  # the RELU after it too
    assert view["first_unsupported"]["opcode"] == "HARD_SWISH" and "HARD_SWISH" in view["first_unsupported"]["reason"]
    assert view == _rendered(analyze(engine.parsed_model))


def test_the_view_is_analysed_once_per_interpreter_and_null_without_a_parsed_graph():
    plugin = _plugin()
    engine = EmulatedEngine.load(MODEL, EngineOptions())
    first = plugin.describe_backend("emulated", engine, None)["edgetpu_view"]
    assert plugin.describe_backend("emulated", engine, None)["edgetpu_view"] is first  # cached, not re-analysed
    reloaded = EmulatedEngine.load(MODEL, EngineOptions())  # a new version's interpreter: analysed again
    again = plugin.describe_backend("emulated", reloaded, None)["edgetpu_view"]
    assert again is not first and again == first and first["mapped"] == first["total"] == 62
    assert plugin.describe_backend("cpu", CpuEngine.load(MODEL, EngineOptions()), None) == {"edgetpu_view": None}


def test_the_estimate_comes_from_model_json_and_is_null_without_one():
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    shown = _plugin().describe_model(model_dir)
    assert shown == {"edgetpu_estimate": model_dir.manifest.edgetpu_estimate.model_dump()}
    assert "not a measurement" in shown["edgetpu_estimate"]["method"]
    bare = model_dir.manifest.model_copy(update={"edgetpu_estimate": None})
    assert Backend.describe_model(_plugin(), model_dir) == {}  # the base hook adds nothing
    assert _plugin().describe_model(dataclasses.replace(model_dir, manifest=bare)) == {"edgetpu_estimate": None}


class NoteEngineDouble:
    """TEST DOUBLE engine of a plug-in from outside: never runs here, only described."""

    key = "note"
    model_file = "int8"

    def __init__(self):
        self.inputs = (TensorSpec("in", (1, 224, 224, 3), np.dtype(np.uint8), 1 / 128, 127),)
        self.outputs = (TensorSpec("out", (1, 1000), np.dtype(np.uint8), 1 / 256, 0),)

    @classmethod
    def load(cls, path, options):
        return cls()

    def run(self, inputs):
        return [np.zeros(self.outputs[0].shape, np.uint8)]

    def close(self):
        pass


class NoteBackendDouble(Backend):
    """TEST DOUBLE plug-in: adds its own keys to /v1/models, and tries to overwrite a core field."""

    key = "note"
    engine = NoteEngineDouble
    model_keys = {"note_board": "the board that saw the model", "name": "not the core's"}
    backend_keys = {"note_fits": "whether the model fits its board"}

    def describe_model(self, model_dir):
        return {"note_board": f"seen {model_dir.name}", "name": "not the core's"}

    def describe_backend(self, backend, engine, model_dir):
        return {"note_fits": backend == self.key, "warm": "not the core's"}


def test_v1_models_merges_every_plugins_keys_and_keeps_the_edgetpu_ones():
    register(NoteBackendDouble)
    try:
        settings = Settings(model_dir=MODELS, models=[DEFAULT_MODEL], backends=["cpu", "emulated", "note"],
                            workers=1, warmup_at_start=False)
        app = create_app(settings)
        with TestClient(app) as client:
            assert service_of(app).registry.wait_loaded(60)
            detail = client.get(f"/v1/models/{DEFAULT_MODEL}").json()
            listed = client.get("/v1/models").json()["models"][0]
            schemas = client.get("/openapi.json").json()["components"]["schemas"]
    finally:
        unregister("note")
    assert listed == detail
    assert detail["name"] == DEFAULT_MODEL and detail["note_board"] == f"seen {DEFAULT_MODEL}"  # the core's wins
    backends = detail["backends"]
    assert [backends[key]["note_fits"] for key in ("cpu", "emulated", "note")] == [False, False, True]
    assert all(entry["warm"] is False for entry in backends.values())
    # the Edge TPU plug-in's keys, as before: the view on the backend that parsed the graph, null elsewhere
    expected_view = _rendered(analyze(EmulatedEngine.load(MODEL, EngineOptions()).parsed_model))
    assert backends["emulated"]["edgetpu_view"] == expected_view
    assert backends["cpu"]["edgetpu_view"] is None and backends["note"]["edgetpu_view"] is None
    recorded = read_model_dir(MODELS / DEFAULT_MODEL).manifest.edgetpu_estimate
    assert detail["edgetpu_estimate"] == recorded.model_dump()
    assert list(detail)[-2:] == ["edgetpu_estimate", "note_board"]  # the core's fields first, as before
    # the keys each plug-in declares are in the API's schema, with what they mean; the core's stay its own
    model_out, backend_out = schemas["ModelDescription"], schemas["BackendDescription"]
    assert model_out["additionalProperties"] is True and backend_out["additionalProperties"] is True
    assert model_out["properties"]["note_board"]["description"] == "the board that saw the model (plug-in 'note')"
    assert model_out["properties"]["name"] == {"title": "Name", "type": "string"}
    assert "not a measurement" in model_out["properties"]["edgetpu_estimate"]["description"]
    assert "edgetpu_compiler would map" in backend_out["properties"]["edgetpu_view"]["description"]
    assert backend_out["properties"]["note_fits"]["description"] == "whether the model fits its board (plug-in 'note')"
