"""DirectRoute: the same answers as FastAPI's own handler, without its dependency solving."""

from contextvars import ContextVar
from types import SimpleNamespace
from typing import Annotated

import pytest
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.testclient import TestClient

from app.api import errors
from app.api.direct import DirectRoute
from app.main import create_app
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS

TopK = Annotated[int, Query(ge=1, description="how many")]
Threshold = Annotated[float, Query(ge=0.0, le=1.0)]
Backend = Annotated[str | None, Query(max_length=4)]


async def endpoint(name: str, request: Request, top_k: TopK = 5, threshold: Threshold = 0.0, backend: Backend = None,
                   flag: bool = False, required: Annotated[int, Query(alias="need")] = ...) -> Response:
    return Response(repr((name, top_k, threshold, backend, flag, required, request.method)))


def app_with(route_class: type[APIRoute], **include) -> FastAPI:
    app = FastAPI()
    errors.install(app)
    router = APIRouter(route_class=route_class)
    router.post("/m/{name}/go")(endpoint)
    app.include_router(router, **include)
    return app


QUERIES = ["need=1", "need=1&top_k=3", "need=1&top_k=0", "need=1&top_k=abc", "need=1&top_k=", "need=1&top_k=3.0",
           "need=1&top_k=1e1", "need=1&top_k=3&top_k=0", "need=1&top_k=0&top_k=3", "need=1&threshold=nan",
           "need=1&threshold=2&backend=toolong&top_k=-1", "need=1&backend=", "need=1&flag=yes", "need=1&flag=maybe",
           "", "top_k=0", "need=x", "need=1&other=2", "need=1&top_k=%ff"]


@pytest.mark.parametrize("query", QUERIES)
def test_the_same_values_and_errors_as_fastapis_own_handler(query):
    direct, solved = TestClient(app_with(DirectRoute)), TestClient(app_with(APIRoute))
    a, b = direct.post(f"/m/x/go?{query}"), solved.post(f"/m/x/go?{query}")
    assert (a.status_code, a.content) == (b.status_code, b.content)


def test_the_openapi_description_is_fastapis():
    assert app_with(DirectRoute).openapi() == app_with(APIRoute).openapi()


def test_a_handler_that_returns_data_is_serialized_by_fastapi():
    app = FastAPI()
    router = APIRouter(route_class=DirectRoute)
    router.get("/data")(lambda_data)
    app.include_router(router)
    assert TestClient(app).get("/data").json() == {"live": True}


async def lambda_data():
    return {"live": True}


def test_a_route_with_dependencies_falls_back_to_fastapis_handler_and_they_run():
    def refuse():
        raise HTTPException(401, "no")

    client = TestClient(app_with(DirectRoute, dependencies=[Depends(refuse)]))
    assert client.post("/m/x/go?need=1").status_code == 401


def test_checks_run_before_the_parameters_are_read():
    def refuse(request: Request):
        raise HTTPException(401, "no key", headers={"WWW-Authenticate": "Bearer"})

    client = TestClient(app_with(DirectRoute.checking(refuse)))
    r = client.post("/m/x/go?top_k=0")  # invalid and missing parameters: still the check's 401
    assert r.status_code == 401 and r.json() == {"error": "no key"} and r.headers["www-authenticate"] == "Bearer"


def test_the_inference_routes_solve_no_dependencies(monkeypatch):
    import fastapi.routing

    solved = []
    real = fastapi.routing.solve_dependencies
    monkeypatch.setattr(fastapi.routing, "solve_dependencies", lambda **kw: solved.append(kw) or real(**kw))
    app = create_app(Settings(model_dir=MODELS, models=[DEFAULT_MODEL], warmup_at_start=False))
    client = TestClient(app)  # no lifespan: the model is not loaded, every request ends early (503)
    for path in ("/v1/classify", f"/v1/models/{DEFAULT_MODEL}/classify?top_k=3", f"/v2/models/{DEFAULT_MODEL}/infer",
                 f"/v2/models/{DEFAULT_MODEL}/versions/1/infer"):
        assert client.post(path, content=b"x", headers={"content-type": "image/jpeg"}).status_code == 503, path
    assert solved == []
    client.get("/v1/models")  # an ordinary route: solved as ever, so the probe above could see one
    assert len(solved) == 1


async def scoped(tenant: str, name: str, top_k: TopK = 5) -> Response:
    return Response(f"{tenant} {name} {top_k}")


def test_a_path_parameter_in_the_inclusion_prefix_is_read_from_the_path():
    answers = []
    for route_class in (DirectRoute, APIRoute):
        app = FastAPI()
        router = APIRouter(route_class=route_class)
        router.get("/m/{name}")(scoped)
        app.include_router(router, prefix="/t/{tenant}")
        r = TestClient(app).get("/t/acme/m/x?top_k=2&tenant=other")
        answers.append((r.status_code, r.text))
    assert answers[0] == answers[1] == (200, "acme x 2")


def test_without_fastapis_inclusion_hook_every_route_falls_back_to_fastapis_handler(monkeypatch):
    """The private hook DirectRoute reads (fastapi.routing._effective_route_context_var, FastAPI pinned
    exactly): there on this FastAPI, and without it routes still answer alike, dependencies run."""
    import fastapi.routing

    from app.api import direct

    assert isinstance(getattr(fastapi.routing, "_effective_route_context_var", None), ContextVar)
    monkeypatch.setattr(direct, "routing", SimpleNamespace())  # a FastAPI without the hook, as DirectRoute sees it
    direct = TestClient(app_with(DirectRoute))
    plain = TestClient(app_with(APIRoute))
    for query in ("need=1&top_k=3", "top_k=0"):
        ours, theirs = direct.post(f"/m/x/go?{query}"), plain.post(f"/m/x/go?{query}")
        assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content)

    def refuse():
        raise HTTPException(401, "no")

    assert TestClient(app_with(DirectRoute, dependencies=[Depends(refuse)])).post("/m/x/go?need=1").status_code == 401
