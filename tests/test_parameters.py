"""A door route's parameters read in front of FastAPI (app/api/parameters.py, run by the table's front route,
app/api/routes.py): the same values and the same errors as FastAPI's own handler, without its dependency solving;
what cannot be read so is FastAPI's to run, and nothing of a web framework's private names is read."""

import ast
from pathlib import Path
from typing import Annotated, Literal

import pytest
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from pydantic import Field
from starlette.exceptions import HTTPException
from starlette.testclient import TestClient

from app.api import errors
from app.api.routes import DoorRoute, InferenceRoutes
from app.main import create_app
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS

TopK = Annotated[int, Query(ge=1, description="how many")]
Threshold = Annotated[float, Field(ge=0.0, le=1.0)]  # a pydantic Field, as a task's options declare theirs
Backend = Annotated[str | None, Query(max_length=4)]


async def endpoint(name: str, request: Request, top_k: TopK = 5, threshold: Threshold = 0.0, backend: Backend = None,
                   flag: bool = False, form: Literal["json", "png"] = "json",
                   required: Annotated[int, Query(alias="need")] = ...) -> Response:
    return Response(repr((name, top_k, threshold, backend, flag, form, required, request.method)))


def apps(route_class: type[DoorRoute] = DoorRoute, **router) -> tuple[FastAPI, FastAPI]:
    """The same door router served by the table in front (its front route first) and by FastAPI alone."""
    door = APIRouter(route_class=route_class, **router)
    door.post("/m/{name}/go")(endpoint)
    table = InferenceRoutes.of([door])
    fronted, alone = FastAPI(routes=[table.front]), FastAPI()
    for app in (fronted, alone):
        errors.install(app)
    table.include(fronted)
    alone.include_router(door)
    return fronted, alone


QUERIES = ["need=1", "need=1&top_k=3", "need=1&top_k=0", "need=1&top_k=abc", "need=1&top_k=", "need=1&top_k=3.0",
           "need=1&top_k=1e1", "need=1&top_k=3&top_k=0", "need=1&top_k=0&top_k=3", "need=1&threshold=nan",
           "need=1&threshold=2&backend=toolong&top_k=-1", "need=1&backend=", "need=1&flag=yes", "need=1&flag=maybe",
           "need=1&form=png", "need=1&form=gif", "", "top_k=0", "need=x", "need=1&other=2", "need=1&top_k=%ff"]


@pytest.mark.parametrize("query", QUERIES)
def test_the_same_values_and_errors_as_fastapis_own_handler(query, monkeypatch):
    solved = solving(monkeypatch)
    fronted, alone = (TestClient(app) for app in apps())
    a = fronted.post(f"/m/x/go?{query}")
    assert solved == []  # read in front
    b = alone.post(f"/m/x/go?{query}")
    assert (a.status_code, a.content) == (b.status_code, b.content)


def test_the_openapi_description_is_fastapis():
    fronted, alone = apps()
    assert fronted.openapi() == alone.openapi()


def test_a_handler_that_returns_data_is_fastapis_to_serialize():
    door = APIRouter(route_class=DoorRoute)
    door.post("/data")(returns_data)
    table = InferenceRoutes.of([door])
    app = FastAPI(routes=[table.front])
    table.include(app)
    assert table.entries[0].app is None  # left to FastAPI
    assert TestClient(app).post("/data").json() == {"live": True}


async def returns_data():
    return {"live": True}


def refuse():
    raise HTTPException(401, "no")


def test_a_route_with_dependencies_is_fastapis_and_they_run(monkeypatch):
    solved = solving(monkeypatch)
    fronted, _ = apps(dependencies=[Depends(refuse)])
    assert TestClient(fronted).post("/m/x/go?need=1").status_code == 401
    assert len(solved) == 1


def refuse_key(request: Request):
    raise HTTPException(401, "no key", headers={"WWW-Authenticate": "Bearer"})


class CheckingRoute(DoorRoute):
    checks = (refuse_key,)


def test_checks_run_before_the_parameters_are_read():
    for app in apps(CheckingRoute):
        r = TestClient(app).post("/m/x/go?top_k=0")  # invalid and missing parameters: still the check's 401
        assert r.status_code == 401 and r.json() == {"error": "no key"} and r.headers["www-authenticate"] == "Bearer"


class AnsweringRoute(DoorRoute):
    @staticmethod
    def failure(request: Request, error: Exception) -> Response | None:
        return Response(f"answered: {type(error).__name__}", status_code=418)


def test_a_protocols_failures_are_answered_the_same_in_front_and_behind():
    for app in apps(AnsweringRoute):
        r = TestClient(app).post("/m/x/go?top_k=0")
        assert (r.status_code, r.text) == (418, "answered: RequestValidationError")


async def scoped(tenant: str, name: str, top_k: TopK = 5) -> Response:
    return Response(f"{tenant} {name} {top_k}")


def test_a_path_parameter_of_the_routers_prefix_is_read_from_the_path(monkeypatch):
    solved = solving(monkeypatch)
    door = APIRouter(prefix="/t/{tenant}", route_class=DoorRoute)
    door.post("/m/{name}")(scoped)
    table = InferenceRoutes.of([door])
    app = FastAPI(routes=[table.front])
    table.include(app)
    client = TestClient(app)
    assert client.post("/t/acme/m/x?top_k=2&tenant=other").text == "acme x 2"
    assert client.post("/t/acme/m/x?top_k=0").json()["detail"][0]["loc"] == ["query", "top_k"]
    assert solved == []


def solving(monkeypatch) -> list:
    """Every call of FastAPI's per-request dependency solving, from now on."""
    import fastapi.routing

    solved = []
    real = fastapi.routing.solve_dependencies
    monkeypatch.setattr(fastapi.routing, "solve_dependencies", lambda **kw: solved.append(kw) or real(**kw))
    return solved


def test_the_inference_routes_solve_no_dependencies(monkeypatch):
    solved = solving(monkeypatch)
    app = create_app(Settings(model_dir=MODELS, models=[DEFAULT_MODEL], warmup_at_start=False))
    client = TestClient(app)  # no lifespan: the model is not loaded, every request ends early (503)
    for path in ("/v1/classify", f"/v1/models/{DEFAULT_MODEL}/classify?top_k=3", "/v1/detect", "/v1/pose",
                 "/v1/segment?format=png", f"/v2/models/{DEFAULT_MODEL}/infer",
                 f"/v2/models/{DEFAULT_MODEL}/versions/1/infer"):
        r = client.post(path, content=b"x", headers={"content-type": "image/jpeg"})
        assert r.status_code in (404, 503), (path, r.status_code)  # no default detector, pose or segmentation model
    assert solved == []
    client.get("/v1/models")  # an ordinary route: solved as ever, so the probe above could see one
    assert len(solved) == 1


FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "uvicorn_worker", "gunicorn", "httptools")


def private_framework_names(source: str) -> list[str]:
    """Private names of a web framework a module imports or reads: `from fastapi.routing import _x`, a module
    path with a private part (`starlette._utils`), `routing._x` or `getattr(routing, "_x")` on a framework
    module. (What a subclass reaches through `self` is not seen here: app/http_server.py's and
    app/gunicorn_worker.py's reach is named by tests/test_http_server.py and tests/test_gunicorn_worker.py.)"""
    def framework(module: str) -> bool:
        return module.split(".")[0] in FRAMEWORKS

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found, modules = [], set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if framework(alias.name):
                    modules.add(alias.asname or alias.name.split(".")[0])
                    found += [alias.name for part in alias.name.split(".") if private(part)]
        elif isinstance(node, ast.ImportFrom) and node.module and framework(node.module):
            found += [node.module for part in node.module.split(".") if private(part)]
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                else:
                    modules.add(alias.asname or alias.name)  # a submodule, a class or a function: any may be read
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{base.id}...{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in modules
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and private(node.args[1].value)):
            found.append(f"{node.args[0].id}.{node.args[1].value}")
    return found


def test_the_service_reads_no_private_name_of_a_web_framework():
    app = Path(__file__).resolve().parents[1] / "app"
    found = {str(path.relative_to(app.parent)): names for path in sorted(app.rglob("*.py"))
             if (names := private_framework_names(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_the_private_names_check_sees_them():
    """What the check above would have found in the route class that read parameters before, had it read a private
    hook of FastAPI's."""
    seen = private_framework_names
    assert seen("from fastapi import routing\nrouting._effective_route_context_var.get()\n") == \
        ["routing..._effective_route_context_var"]
    assert seen('from fastapi import routing\ngetattr(routing, "_effective_route_context_var")\n') == \
        ["routing._effective_route_context_var"]
    assert seen("from starlette._utils import get_route_path\n") == ["starlette._utils"]
    assert seen("from fastapi.routing import _IncludedRouter\n") == ["fastapi.routing._IncludedRouter"]
    assert seen("import uvicorn._compat\n") == ["uvicorn._compat"]
    assert seen("from fastapi.routing import APIRoute\nAPIRoute.__init__\nx._y\n") == []
