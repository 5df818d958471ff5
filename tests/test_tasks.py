"""The task seam (app/tasks/): a model's task checks its outputs at load, by tensor name, and a third task
is its module, its schema and its route.

A throwaway task, "features" (the dequantized output vector), lives in this file only: its
module (FeaturesTask: roles, `read`), its schema (FeaturesResponse) and its route (`router`, a front door
calling the core). Registered with app.tasks.register and app.api.doors.add, it is served over a real socket on
a tiny model built here, with nothing else touched. The roles check is shown on the shared tiny detectors
(tests/detection_models.py: TF1 and TF2 output orders) with a throwaway four-role task, and on
classifiers with several outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import APIRouter, Request, Response
from PIL import Image
from pydantic import BaseModel

from app import tasks
from app.api import doors
from app.api.auth import check_inference_key
from app.api.body import image_bytes
from app.api.direct import DirectRoute
from app.api.held import held
from app.api.routes import Inference, v1_head
from app.core import ImageInput
from app.engines import TensorSpec
from app.errors import ModelDirError
from app.http_server import config
from app.main import create_app
from app.api.deps import app_door, door_of, service_of
from app.model_dir.reading import ModelDir, read_model_dir
from app.model_dir.schema import Manifest
from app.registry import Registry
from app.settings import Settings
from app.tasks import Outputs, Task
from app.tasks.base import Timing, resolve_roles
from bench.service import free_port
from converter.model_dir import write_model_dir
from tests.detection_models import OUTPUT_ORDERS, output_names, square_image, tiny_detector
from tests.tflite_builder import GraphBuilder
from tests.waiting import until

EVENTUALLY_S = 60


# ---- the throwaway task: its module, its schema, its route -------------------------------------

class FeaturesResponse(BaseModel):
    model: str
    backend: str
    features: list[float]
    timing_ms: Timing


@dataclass(frozen=True)
class Features:
    features: list[float]


class FeaturesTask(Task):
    """The model's output vector, dequantized."""

    name = "features"
    roles = ("features",)
    schema = FeaturesResponse

    def read(self, outputs: Outputs, options) -> Features:
        spec = outputs.spec("features")
        values = outputs.of("features").reshape(-1).astype(np.float64)
        if spec.scale > 0:
            values = (values - spec.zero_point) * spec.scale
        return Features(values.tolist())


TASK = FeaturesTask()


class FeaturesRoute(DirectRoute):
    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["features"], route_class=FeaturesRoute)


@router.post("/models/{name}/features", response_model=FeaturesResponse)
async def features_named(name: str, request: Request, backend: str | None = None) -> Response:
    async with held(request, TASK, name, backend) as ticket:
        given = ImageInput(await image_bytes(request, door_of(request).settings.max_body_bytes))
        answer = await door_of(request).core.answer(ticket, given)
    return Response(FeaturesResponse(**TASK.native(answer)).model_dump_json(), media_type="application/json")


@pytest.fixture
def features_task():
    tasks.register(TASK)
    doors.add(router)
    try:
        yield TASK
    finally:
        doors.remove(router)
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


# ---- a third task, over HTTP ----------------------------------------------------------------------------

def test_a_task_is_its_module_its_schema_and_its_route(tmp_path, features_task, cat_png):
    for name, order in (("features_a", "features,pooled"), ("features_b", "pooled,features")):
        model_dir(tmp_path, name, vectors(order), "features", 2, {"features": "features"})
    settings = Settings(model_dir=tmp_path, models=["features_a", "features_b"], default_model="features_a",
                        backends=["cpu", "emulated"], workers=1)
    # dequantized: q * scale, the scale as the model file stores it (float32 1/255)
    expected = (PIXELS.reshape(-1).astype(np.float64) * float(np.float32(1 / 255))).tolist()
    with served(settings) as (app, url), httpx.Client(base_url=url, timeout=60) as client:
        assert "/v1/models/{name}/features" in app_door(app).routes.paths  # shed, counted, admitted
        for name in ("features_a", "features_b"):  # its output found by name, first or second
            for backend in ("cpu", "emulated"):
                r = client.post(f"/v1/models/{name}/features?backend={backend}", content=png(PIXELS),
                                headers={"content-type": "image/png"})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["model"] == name and body["backend"] == backend
                assert body["features"] == expected
                assert {"decode", "preprocess", "queue", "inference", "postprocess", "total"} <= set(body["timing_ms"])
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
    model_dir(tmp_path, "features", vectors("features,pooled"), "features", 2, {"features": "features"})
    registry = Registry(Settings(model_dir=tmp_path, backends=["cpu"], workers=1))
    registry.configure()
    registry.load_all()
    try:
        status = registry.status("features")
        assert status.state == "failed"
        assert status.error == ("model 'features': model.json says task 'features', which this service has no task "
                                "module for; known tasks: ['classification', 'detection', 'embedding', 'pose', "
                                "'segmentation']")
    finally:
        registry.close()


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
