"""The table of the doors' routes (app/api/routes.py), generated from their declarations: in the doors' one order
(app/api/doors.py), a route declared on a door's router, and nowhere else, is run in front of FastAPI's router,
shed from its head, counted in Prometheus, and admitted through the registry's ticket."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import APIRouter, Query, Request, Response
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from app.api import doors
from app.api.auth import check_inference_key
from app.api.held import answer_image
from app.api.routes import BackendQuery, DoorRoute, Inference, InferenceRoutes
from app.api.shedding import HeadAdmission
from app.api.app import inference_routers
from app.main import create_app
from app.api.deps import app_door, service_of
from app.settings import Settings
from app.tasks import TASKS
from app.tasks.classify import ClassifyOptions
from tests.conftest import MODELS

MODEL = "fashion_mnist"
NEW_PATH = "/v1/models/{name}/classify-top1"


class TopOneRoute(DoorRoute):
    """A new door's route class: the key checked first; inference routes of protocol "v1" answering classifiers."""

    checks = (check_inference_key,)
    inference = Inference("v1", TASKS["classification"])


async def classify_top1(name: str, request: Request, backend: BackendQuery = None,
                        unused: Annotated[int, Query(ge=0)] = 0) -> Response:
    """A new endpoint: the best class only."""
    answer = await answer_image(request, TASKS["classification"], name, backend, ClassifyOptions(top_k=1))
    return Response(answer.json(), media_type="application/json")


@pytest.fixture
def new_route():
    """classify_top1 declared on a new door's router (its one place), for this test only."""
    router = APIRouter(route_class=TopOneRoute)
    router.post(NEW_PATH, summary="The best class only")(classify_top1)
    doors.add(router)
    try:
        yield f"/v1/models/{MODEL}/classify-top1"
    finally:
        doors.remove(router)


def answered(status: str, protocol: str = "v1") -> float:
    labels = {"protocol": protocol, "task": "classification", "model": MODEL, "backend": "cpu", "status": status}
    return REGISTRY.get_sample_value("edgetpu_serve_requests_total", labels) or 0.0


def test_the_table_holds_the_inference_routes_in_the_doors_order():
    routes = InferenceRoutes.of(inference_routers())
    # the native routes first (made from the task list), OIP v2's, CodeProject.AI's list (no model: not an
    # inference route, but in the table ahead of DeepStack's custom/{name}), DeepStack's, DOODS'
    assert [entry.route.path for entry in routes.entries] == [
        "/v1/classify", "/v1/models/{name}/classify", "/v1/detect", "/v1/models/{name}/detect", "/v1/embed",
        "/v1/models/{name}/embed", "/v1/pose", "/v1/models/{name}/pose", "/v1/segment", "/v1/models/{name}/segment", "/v2/models/{name}/infer",
        "/v2/models/{name}/versions/{version}/infer", "/v1/vision/custom/list", "/v1/vision/detection",
        "/v1/vision/custom/{name}", "/detect"]
    assert "/v1/vision/custom/list" not in routes.paths and "/detect" in routes.paths
    assert routes.protocol_of("POST", "/v1/models/m/classify") == "v1"
    assert routes.protocol_of("POST", "/detect") == "doods"
    assert routes.protocol_of("POST", "/v1/models/m/detect") == "v1"
    assert routes.protocol_of("POST", "/v1/vision/custom/m") == "deepstack"
    assert routes.protocol_of("POST", "/v1/vision/custom/list") is None  # CodeProject.AI's, first: no model runs
    assert routes.protocol_of("POST", "/v2/models/m/versions/1/infer") == "v2"
    assert routes.protocol_of("GET", "/v1/classify") is None  # a POST route only
    assert routes.protocol_of("POST", "/v1/models/m/reload") is None  # not a door's route
    assert routes.protocol_of("POST", "/v1/classify/extra") is None


def test_the_head_places_a_request_as_its_route_declares():
    routes = InferenceRoutes.of(inference_routers())
    classification, detection = TASKS["classification"], TASKS["detection"]

    def placed(target: str):
        found = routes.place(b"POST", target.encode())
        return None if found is None else found[1:]

    # the model in the path (`name`, else the task's default), the backend in the query where the handler declares it
    assert placed("/v1/classify?top_k=2&backend=cpu") == (classification, None, "cpu")
    assert placed("/v1/models/m/classify") == (classification, "m", None)
    assert placed("/v1/vision/custom/m?backend=emulated") == (detection, "m", "emulated")
    assert placed("/v2/models/m/infer?backend=cpu") == (None, "m", None)  # v2 declares no backend in its query
    assert placed("/v2/models/m/versions/1/infer") == (None, "m", None)
    assert placed("/v2/models/m/versions/9/infer") is None  # only version 1 is placed: the route answers the rest
    assert placed("/detect") is None  # DOODS names its model in the body
    assert placed("/v1/vision/custom/list") is None  # no model
    assert placed("/v1/models/m%2Fx/classify") is None  # percent-encoded: the application decodes it
    assert routes.place(b"GET", b"/v1/classify") is None


def test_a_route_declared_once_is_run_in_front_shed_counted_and_admitted(new_route, cat_png):
    settings = Settings(model_dir=MODELS, models=[MODEL], default_model=MODEL, backends=["cpu"], workers=1,
                        max_waiting=0, retry_after_s=2)
    app = create_app(settings)
    routes = app_door(app).routes
    assert NEW_PATH in routes.paths and routes.match(new_route)[0].app is not None  # run in front
    with TestClient(app) as client:  # the lifespan loads the model
        registry = service_of(app).registry
        assert registry.wait_loaded(60)
        image = cat_png.read_bytes()
        ok = answered("200")
        # admitted: the ticket places it on the model's pool, and it is answered and counted
        r = client.post(new_route, content=image, headers={"content-type": "image/png"})
        assert r.status_code == 200 and len(r.json()["predictions"]) == 1
        assert answered("200") == ok + 1
        assert client.post(f"{new_route}?unused=-1", content=image).status_code == 422  # its parameters, checked
        place = registry.get(MODEL).pool("cpu").admit()  # the line of 1 is full
        try:
            # shed: the HTTP server's head check refuses it before any body, in the app's words
            check = HeadAdmission(service_of(app).core, routes)
            refused = answered("503")
            refusal = check(b"POST", new_route.encode())
            assert refusal is not None and refusal.status == 503 and refusal.headers == {"Retry-After": "2"}
            assert answered("503") == refused + 1  # counted as the application's own answers are
            # and through the application, the ticket refuses it the same way, counted too
            r = client.post(new_route, content=image, headers={"content-type": "image/png"})
            assert r.status_code == 503 and r.json()["error"] == refusal.message
            assert answered("503") == refused + 2
        finally:
            place.release()
        assert client.get(new_route).status_code == 405  # another method: FastAPI's routes behind answer it
