"""The table of inference routes (app/api/routes.py): a route declared on an inference router, and nowhere
else, is shed from its head, counted in Prometheus, and admitted through the registry's ticket."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import Query, Request, Response
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from app.api import classify
from app.api.routes import InferenceRoutes
from app.api.shedding import HeadAdmission
from app.api.app import inference_routers
from app.main import create_app
from app.api.deps import app_door, service_of
from app.settings import Settings
from tests.conftest import MODELS

MODEL = "fashion_mnist"
NEW_PATH = "/models/{name}/classify-top1"  # under classify.router's /v1


async def classify_top1(name: str, request: Request,
                        backend: Annotated[str | None, Query(max_length=32)] = None) -> Response:
    """A new endpoint: the best class only."""
    return await classify._classify(request, name, 1, 0.0, backend)


@pytest.fixture
def new_route():
    """classify_top1 declared on the v1 inference router (its one place), for this test only."""
    router = classify.router
    before = list(router.routes)
    router.post(NEW_PATH, summary="The best class only")(classify_top1)
    try:
        yield f"/v1/models/{MODEL}/classify-top1"
    finally:
        router.routes[:] = before


def answered(status: str, protocol: str = "v1") -> float:
    labels = {"protocol": protocol, "task": "classification", "model": MODEL, "backend": "cpu", "status": status}
    return REGISTRY.get_sample_value("edgetpu_serve_requests_total", labels) or 0.0


def test_the_table_holds_the_inference_routes_of_both_protocols():
    routes = InferenceRoutes.of(route for router in inference_routers() for route in router.routes)
    # every front door's, by rank (app/api/doors.py): the native routes and OIP v2's first, the newer doors after
    assert routes.paths == ["/v1/classify", "/v1/models/{name}/classify", "/v1/detect", "/v1/models/{name}/detect",
                            "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer",
                            "/v1/vision/detection", "/v1/vision/custom/{name}", "/detect",
                            "/v1/embed", "/v1/models/{name}/embed", "/v1/pose", "/v1/models/{name}/pose",
                            "/v1/segment", "/v1/models/{name}/segment"]
    assert routes.protocol_of("POST", "/v1/models/m/classify") == "v1"
    assert routes.protocol_of("POST", "/detect") == "doods"
    assert routes.protocol_of("POST", "/v1/models/m/detect") == "v1"
    assert routes.protocol_of("POST", "/v1/vision/custom/m") == "deepstack"
    assert routes.protocol_of("POST", "/v2/models/m/versions/1/infer") == "v2"
    assert routes.protocol_of("GET", "/v1/classify") is None  # a POST route only
    assert routes.protocol_of("POST", "/v1/models/m/reload") is None  # not an inference route
    assert routes.protocol_of("POST", "/v1/classify/extra") is None


def test_a_route_declared_once_is_shed_counted_and_admitted(new_route, cat_png):
    settings = Settings(model_dir=MODELS, models=[MODEL], default_model=MODEL, backends=["cpu"], workers=1,
                        max_waiting=0, retry_after_s=2)
    app = create_app(settings)
    assert "/v1" + NEW_PATH in app_door(app).routes.paths
    with TestClient(app) as client:  # the lifespan loads the model
        registry = service_of(app).registry
        assert registry.wait_loaded(60)
        image = cat_png.read_bytes()
        ok = answered("200")
        # admitted: the lease places it on the model's pool, and it is answered and counted
        r = client.post(new_route, content=image, headers={"content-type": "image/png"})
        assert r.status_code == 200 and len(r.json()["predictions"]) == 1
        assert answered("200") == ok + 1
        place = registry.get(MODEL).pool("cpu").admit()  # the line of 1 is full
        try:
            # shed: the HTTP server's head check refuses it before any body, in the app's words
            check = HeadAdmission(service_of(app).core, app_door(app).routes)
            refused = answered("503")
            refusal = check(b"POST", new_route.encode())
            assert refusal is not None and refusal.status == 503 and refusal.headers == {"Retry-After": "2"}
            assert answered("503") == refused + 1  # counted as the application's own answers are
            # and through the application, the lease refuses it the same way, counted too
            r = client.post(new_route, content=image, headers={"content-type": "image/png"})
            assert r.status_code == 503 and r.json()["error"] == refusal.message
            assert answered("503") == refused + 2
        finally:
            place.release()
