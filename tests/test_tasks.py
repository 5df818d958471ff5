"""The task seam (app/tasks/): a model's task checks its outputs at load, by tensor name; a new task is its module
alone; and every task's result is one type, whose JSON is its schema's.

A throwaway task, "features" (the dequantized output vector), lives in this file only, as a task module would: its
result type (`Features`, a vector), its options (`scale`, a query parameter with its constraint), its other form
(`csv`) and its reading of the outputs. Registered with app.tasks.register and nothing else, it gets its native
routes (/v1/features, /v1/models/{name}/features), their OpenAPI description and a place in the table of inference
routes, and is served over a real socket on a tiny model built here. The roles check is shown on the shared tiny
detectors (tests/detection_models.py: TF1 and TF2 output orders) with a throwaway four-role task, and on
classifiers with several outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import threading
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
import jsonschema_rs
import numpy as np
import pytest
import uvicorn
from PIL import Image
from pydantic import Field

from app import tasks
from app.api import doors
from app.engines import TensorSpec
from app.errors import ModelDirError
from app.http_server import config
from app.main import create_app
from app.api.deps import app_door, service_of
from app.model_dir.reading import ModelDir, read_model_dir
from app.model_dir.schema import Manifest
from app.registry import Registry
from app.settings import Settings
from app.tasks import Answer, Outputs, Task
from app.tasks.base import resolve_roles
from app.tasks.results import Internal, Render, Vector, answer_adapter, answer_schema, wire_fields
from bench.service import free_port
from converter.model_dir import write_model_dir
from tests.detection_models import OUTPUT_ORDERS, output_names, square_image, tiny_detector
from tests.tflite_builder import GraphBuilder
from tests.waiting import until

EVENTUALLY_S = 60


# ---- the throwaway task: its module alone ---------------------------------------------------------------

@dataclass(frozen=True)
class Features:
    """The model's output vector, dequantized and scaled."""

    features: Annotated[Vector, Field(description="the output's values, times `scale`")]
    size: int
    raw: Annotated[np.ndarray, Internal]  # kept for the csv form, never sent


@dataclass(frozen=True)
class FeaturesOptions:
    scale: Annotated[float, Field(gt=0.0, le=100.0, description="what the values are multiplied by")] = 1.0


def as_csv(result: Features) -> bytes:
    return ",".join(str(int(v)) for v in result.raw.reshape(-1)).encode()


class FeaturesTask(Task, name="features", verb="features", summary="The features of an image"):
    """The model's output vector, dequantized."""

    roles = ("features",)
    renders = {"csv": Render("text/csv", "the output as the model gave it, comma-separated", as_csv)}

    def read(self, outputs: Outputs, options: FeaturesOptions) -> Features:
        spec, raw = outputs.spec("features"), outputs.of("features")
        values = raw.reshape(-1).astype(np.float64)
        if spec.scale > 0:
            values = (values - spec.zero_point) * spec.scale
        return Features(values * options.scale, values.size, raw)


TASK = FeaturesTask()


@pytest.fixture
def features_task():
    tasks.register(TASK)
    try:
        yield TASK
    finally:
        tasks.unregister(TASK.name)


# ---- tiny models ------------------------------------------------------------------------------------------

def vectors(order: str) -> bytes:
    """uint8 [1, 2, 2, 3] -> `features` [1, 12] (the pixels, reshaped) and `pooled` [1, 1, 1, 3] (a 2x2 max
    pool), listed in `order` ("features,pooled" or the reverse)."""
    g = GraphBuilder()
    image = g.tensor("image", [1, 2, 2, 3], "UINT8", scale=1 / 255, zero_point=0)
    features = g.tensor("features", [1, 12], "UINT8", scale=1 / 255, zero_point=0)
    g.op("RESHAPE", [image, g.constant("shape", [1, 12])], [features], newShape=[1, 12])
    pooled = g.tensor("pooled", [1, 1, 1, 3], "UINT8", scale=1 / 255, zero_point=0)
    g.op("MAX_POOL_2D", [image], [pooled], padding="VALID", strideW=2, strideH=2, filterWidth=2, filterHeight=2)
    by_name = {"features": features, "pooled": pooled}
    return g.build([image], [by_name[name] for name in order.split(",")])


def two_input_model() -> bytes:
    g = GraphBuilder()
    a = g.tensor("a", [1, 2, 2, 3], "UINT8", scale=1 / 255, zero_point=0)
    b = g.tensor("b", [1, 2, 2, 3], "UINT8", scale=1 / 255, zero_point=0)
    y = g.tensor("sum", [1, 2, 2, 3], "UINT8", scale=2 / 255, zero_point=0)
    g.op("ADD", [a, b], [y])
    return g.build([a, b], [y])


def model_dir(root: Path, name: str, model: bytes, task: str, size: int, outputs: dict | None = None) -> Path:
    """A model directory: the pixels go in as they are (uint8, scale 1/255: mean 0, std 255)."""
    manifest = {"name": name, "task": task, "source": "built by tests/test_tasks.py", "licence": "MIT",
                "input": {"width": size, "height": size, "resize": "stretch", "mean": [0, 0, 0], "std": [255] * 3},
                "outputs": outputs or {}}
    return write_model_dir(root, manifest, {"int8": (f"{name}_int8.tflite", model)})


PIXELS = np.array([[[10, 20, 30], [40, 50, 60]], [[70, 80, 90], [200, 210, 255]]], np.uint8)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@contextlib.contextmanager
def served(settings: Settings):
    """The app over a real loopback socket, on this process's thread (so a task registered here is served)."""
    app = create_app(settings)
    server = uvicorn.Server(config(app, settings, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        def started() -> bool:
            assert thread.is_alive(), "the service's thread ended"
            return server.started and service_of(app).registry.wait_loaded(0)
        until(started, EVENTUALLY_S, "the service started")
        yield app, f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)


# ---- a new task, over HTTP ----------------------------------------------------------------------------

def test_a_new_task_is_its_module_alone(tmp_path, features_task):
    for name, order in (("features_a", "features,pooled"), ("features_b", "pooled,features")):
        model_dir(tmp_path, name, vectors(order), "features", 2, {"features": "features"})
    settings = Settings(model_dir=tmp_path, models=["features_a", "features_b"], backends=["cpu", "emulated"],
                        workers=1)
    # dequantized: q * scale, the scale as the model file stores it (float32 1/255), then the option's scale
    expected = ((PIXELS.reshape(-1).astype(np.float64) - 0) * float(np.float32(1 / 255)) * 2.5).tolist()
    with served(settings) as (app, url), httpx.Client(base_url=url, timeout=60) as client:
        # its routes, in the table of inference routes (shed, counted, admitted) and in the OpenAPI description
        assert {"/v1/features", "/v1/models/{name}/features"} <= set(app_door(app).routes.paths)
        spec = client.get("/openapi.json").json()
        operation = spec["paths"]["/v1/models/{name}/features"]["post"]
        parameters = {p["name"]: p["schema"] for p in operation["parameters"]}
        assert parameters["scale"]["exclusiveMinimum"] == 0 and parameters["scale"]["maximum"] == 100
        assert parameters["scale"]["description"] == "what the values are multiplied by"
        assert parameters["format"]["enum"] == ["json", "csv"] and parameters["backend"]["enum"] == ["cpu", "emulated"]
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/csv"}
        answer = spec["components"]["schemas"]["FeaturesResponse"]
        assert list(answer["properties"]) == ["model", "backend", "features", "size", "timing_ms", "warmup", "cold"]
        schema = answer_adapter(Features, "FeaturesResponse").json_schema(mode="serialization")
        for name in ("features_a", "features_b"):  # its output found by name, first or second
            for backend in ("cpu", "emulated"):
                r = client.post(f"/v1/models/{name}/features?backend={backend}&scale=2.5", content=png(PIXELS),
                                headers={"content-type": "image/png"})
                assert r.status_code == 200, r.text
                body = r.json()
                jsonschema_rs.validate(schema, body)
                assert (body["model"], body["backend"], body["size"]) == (name, backend, 12)
                assert body["features"] == expected
                assert {"decode", "preprocess", "queue", "inference", "postprocess", "total"} <= set(body["timing_ms"])
        # its other form, the envelope in headers
        csv = client.post("/v1/models/features_a/features?format=csv", content=png(PIXELS),
                          headers={"content-type": "image/png"})
        assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
        assert csv.content == ",".join(str(v) for v in PIXELS.reshape(-1).tolist()).encode()
        assert csv.headers["x-model"] == "features_a" and "csv" in json.loads(csv.headers["x-timing-ms"])
        # its option checked as declared; no default model among two of the task
        refused = client.post("/v1/models/features_a/features?scale=0", content=png(PIXELS),
                              headers={"content-type": "image/png"})
        assert refused.status_code == 422 and refused.json()["error"].startswith("scale: ")
        assert client.post("/v1/features", content=png(PIXELS), headers={"content-type": "image/png"}).status_code == 404
        # OIP v2: the task's named outputs, by default each role's tensor as the model gave it
        meta = client.get("/v2/models/features_b").json()
        assert meta["outputs"] == [{"name": "features", "datatype": "UINT8", "shape": [-1, 12]}]
        v2 = client.post("/v2/models/features_b/infer", json={"inputs": [{
            "name": "image", "shape": [1, 2, 2, 3], "datatype": "UINT8", "data": PIXELS.reshape(-1).tolist()}]})
        assert v2.status_code == 200, v2.text
        assert v2.json()["outputs"][0]["data"] == PIXELS.reshape(-1).tolist()
        # the classification route refuses it, saying why
        wrong = client.post("/v1/models/features_a/classify", content=png(PIXELS),
                            headers={"content-type": "image/png"})
        assert wrong.status_code == 400
        assert wrong.json()["error"] == ("model 'features_a' has task 'features'; this route answers classification "
                                         "models only")


def test_without_its_module_a_task_is_refused_at_load_naming_the_known_ones(tmp_path):
    model_dir(tmp_path, "vectors", vectors("features,pooled"), "features", 2, {"features": "features"})
    registry = Registry(Settings(model_dir=tmp_path, backends=["cpu"], workers=1))
    registry.configure()
    registry.load_all()
    try:
        status = registry.status("vectors")
        assert status.state == "failed"
        assert status.error == ("model 'vectors': model.json says task 'features', which this service has no task "
                                "module for; known tasks: ['classification', 'detection', 'embedding', 'pose', 'segmentation']")
    finally:
        registry.close()


# ---- one type per result: its JSON is its schema's ----------------------------------------------------------

def sample(hint):
    """A value of a result's field type, for the schema check: numbers exact in binary, lists of two."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return sample(args[0])
    if hint is np.ndarray:
        return np.array([0.5, 0.25], np.float32)
    if origin in (list, tuple, frozenset):
        return origin([sample(args[0]), sample(args[0])])
    if args and type(None) in args:  # X | None: an X
        return sample(next(arg for arg in args if arg is not type(None)))
    if isinstance(hint, types.UnionType):  # X | Y (detection's objects with landmarks or without): an X
        return sample(args[0])
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint, include_extras=True)
        return hint(**{f.name: sample(hints[f.name]) for f in dataclasses.fields(hint)})
    return {int: 3, float: 0.5, str: "x", bool: True}[hint]


@pytest.mark.parametrize("segments", [None, [1.5, 2.25]])
def test_every_tasks_json_is_what_its_schema_says_and_dumps(features_task, segments):
    """Answer.json (orjson, the request path's) against the schema the native routes document (answer_schema): the
    same bytes as its TypeAdapter dumps, valid against its JSON schema; fields marked Internal never sent."""
    timing = {"decode": 0.25, "preprocess": 1e-7, "queue": 0.03125, "inference": 2.5, "postprocess": 0.0,
              "total": 1234.5, **({"segments": segments} if segments else {})}
    for task in tasks.TASKS.values():
        name = f"{task.verb.capitalize()}Response"
        result = sample(task.result)
        answer = Answer(model="m", backend="cpu", result=result, timing_ms=timing,
                        warmup={"load_ms": 161.25, "first_inference_ms": None}, cold=True)
        adapter = answer_adapter(task.result, name)
        flat = answer_schema(task.result, name)(model="m", backend="cpu", timing_ms=timing, warmup=answer.warmup,
                                                cold=True, **{f: getattr(result, f) for f in wire_fields(task.result)})
        assert answer.json() == adapter.dump_json(flat), task.name
        jsonschema_rs.validate(adapter.json_schema(mode="serialization"), json.loads(answer.json()))
    assert (TASK.result, TASK.options) == (Features, FeaturesOptions)  # read's annotations say them
    assert wire_fields(Features) == ("features", "size")  # `raw` kept, not sent
    segmentation = tasks.TASKS["segmentation"].result
    assert wire_fields(segmentation) == ("image", "classes", "seen")


# ---- roles, by tensor name ---------------------------------------------------------------------------------

class FourRolesTask(Task):
    """Throwaway: reads a detector's four post-processed outputs by role (no detection here, only the roles)."""

    name = "four_roles"
    roles = ("boxes", "classes", "scores", "count")


def test_a_detectors_four_outputs_resolve_by_name_in_every_exporters_order(tmp_path):
    for order in OUTPUT_ORDERS:
        model_dir(tmp_path, f"detector_{order}", tiny_detector(order=order), "four_roles", 16, output_names(order))
    four = FourRolesTask()
    registry = Registry(Settings(model_dir=tmp_path, backends=["cpu"], workers=1),
                        tasks={**tasks.TASKS, four.name: four})
    registry.configure()
    registry.load_all()
    image = square_image(16, 4, 8, 8)[None]
    try:
        answers = {}
        for order, roles_in_order in OUTPUT_ORDERS.items():
            version = registry.get(f"detector_{order}")
            roles = version.roles["cpu"]  # resolved once, at load
            assert [roles.index[role] for role in roles_in_order] == [0, 1, 2, 3]

            async def run():
                async with registry.ticket(f"detector_{order}") as ticket:
                    return await ticket.run(image)

            outputs = asyncio.run(run()).outputs
            answers[order] = {role: roles.of(outputs, role) for role in four.roles}
        tf1, tf2 = answers["tf1"], answers["tf2"]
        assert int(tf1["count"][0]) == 4  # the square, as tests/test_detection_models.py finds it
        for role in four.roles:
            np.testing.assert_array_equal(tf1[role], tf2[role])
    finally:
        registry.close()


def _model_dir(outputs: dict, task: str = "classification") -> ModelDir:
    manifest = Manifest.model_validate({"name": "m", "task": task, "source": "test", "licence": "MIT",
                                        "input": {"width": 2, "height": 2, "mean": [0], "std": [1]},
                                        "outputs": outputs})
    return ModelDir(Path("m"), manifest, ())


SPECS = (TensorSpec("logits", (1, 10), np.dtype(np.uint8), 0.1, 0),
         TensorSpec("probabilities", (1, 10), np.dtype(np.float32), 0.0, 0))


def test_a_classifier_with_several_outputs_must_name_its_scores_output():
    classification = tasks.TASKS["classification"]
    with pytest.raises(ModelDirError, match=r"has 2 output tensors \['logits', 'probabilities'\]: model.json must "
                                            r"name its 'scores' output in `outputs`"):
        resolve_roles(classification, _model_dir({}), SPECS)
    for name, index in (("probabilities", 1), ("logits", 0)):
        roles = classification.bind(_model_dir({"scores": name}), SPECS)
        assert (roles.index, roles.specs) == ({"scores": index}, {"scores": SPECS[index]})
        assert [(out.name, out.shape) for out in roles.named] == [("scores", (10,)), ("raw", (10,))]
    one = classification.bind(_model_dir({}), SPECS[1:])  # one output needs no name
    assert one.index == {"scores": 0}


def test_a_wrong_name_or_role_says_what_the_model_has():
    classification = tasks.TASKS["classification"]
    with pytest.raises(ModelDirError, match=r"outputs.scores names tensor 'score'; the model's output tensors are "
                                            r"\['logits', 'probabilities'\]"):
        classification.bind(_model_dir({"scores": "score"}), SPECS)
    with pytest.raises(ModelDirError, match=r"names \['boxes'\], roles the classification task does not read; "
                                            r"its roles: \['scores'\]"):
        classification.bind(_model_dir({"scores": "logits", "boxes": "probabilities"}), SPECS)
    twice = (SPECS[0], TensorSpec("logits", (1, 10), np.dtype(np.uint8), 0.2, 0))
    with pytest.raises(ModelDirError, match="that name twice"):
        classification.bind(_model_dir({"scores": "logits"}), twice)


def test_a_model_must_fit_the_image_front_door_one_input(tmp_path):
    model_dir(tmp_path, "two_inputs", two_input_model(), "classification", 2)
    registry = Registry(Settings(model_dir=tmp_path, backends=["cpu"], workers=1))
    registry.configure()
    registry.load_all()
    try:
        status = registry.status("two_inputs")
        assert status.state == "failed" and status.error == (
            "model 'two_inputs' has 2 input tensors ['a', 'b']; the service feeds one image, so a model must "
            "have exactly one input")
    finally:
        registry.close()


def test_an_image_input_is_float32_or_an_integer_tensor_with_a_positive_scale():
    """An image is quantized into the input with its scale: an int32 input of scale 0 cannot take one, refused at
    load with a model-directory error (a failed model, never a crash of the start or a reload); an 8-bit input of
    scale 0 takes the values themselves (MoveNet's uint8 input, cast to float inside the model)."""
    from app.registry.loading import image_input

    model_dir = _model_dir({})
    channels = model_dir.manifest.input.channels
    for spec in (TensorSpec("image", (1, 2, 2, channels), np.dtype(np.int32), 0.0, 0),
                 TensorSpec("image", (1, 2, 2, channels), np.dtype(np.bool_), 1.0, 0)):
        with pytest.raises(ModelDirError, match=f"its input tensor 'image' is {spec.dtype.name} with scale "
                                                f"{spec.scale}; an image goes in as float32, quantized"):
            image_input(model_dir, [spec])
    for spec in (TensorSpec("image", (1, 2, 2, channels), np.dtype(np.int8), 0.02, -1),
                 TensorSpec("image", (1, 2, 2, channels), np.dtype(np.uint8), 0.0, 0),
                 TensorSpec("image", (1, 2, 2, channels), np.dtype(np.float32), 0.0, 0)):
        assert image_input(model_dir, [spec]) is spec


def test_the_tasks_on_main_and_their_doors():
    assert set(tasks.TASKS) == {"classification", "detection", "segmentation", "pose", "embedding"}
    paths = {route.path for router in doors.inference_routers() for route in router.routes}
    assert {"/v1/models/{name}/detect", "/v1/vision/custom/{name}", "/v1/models/{name}/classify",
            "/v2/models/{name}/infer", "/v1/models/{name}/segment", "/v1/models/{name}/pose",
            "/v1/models/{name}/embed", "/v1/embed"} <= paths
    models = Path(__file__).parents[1] / "models"
    assert read_model_dir(models / "efficientnet_lite0").manifest.task == "classification"
    assert read_model_dir(models / "ssdlite_mobilenet_v2_person").manifest.task == "detection"


def test_the_answer_json_bench_runs_and_checks_its_bytes():
    """bench/answer_json.py, briefly: a row per task, each way's figure a positive number (orjson's bytes checked
    equal to the TypeAdapter's before any timing)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "answer_json.py"), "-n", "20", "--rounds", "1"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in out.stdout.splitlines()[2:]}
    assert set(rows) == {"classification", "detection", "pose", "segmentation"}
    assert all(len(values) == 5 and min(values) > 0 for values in rows.values())
