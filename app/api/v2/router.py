"""The Open Inference Protocol (KServe v2) REST front door: /v2/...

Thin: hold the model through the core (the room check, before the body), read the body through the body
budget, parse it (wire.py), run it through the core (infer.py), encode the answer. Every error becomes
{"error": ...} through errors.py's table, handled inside the route so the connection stays
open. `health` holds the routes that stay open like /healthz; `router` the ones that take
the inference key (app/main.py); `inference` the two infer routes, a door (app/api/doors.py) of
V2InferenceRoute: run in front of FastAPI's router (app/api/routes.py), the inference key checked first.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.auth import check_inference_key
from app.api.body import hold_more, read_limited
from app.api.deps import CoreDep, SettingsDep, door_of
from app.api.errors import REFUSED, log_bug, refusals
from app.api.held import held
from app.api.routes import DoorRoute, Inference
from app.api.schemas import ErrorResponse
from app.api.v2 import infer as v2
from app.api.v2.errors import retry_after, status_of
from app.api.v2.wire import BYTES, DTYPES, HEADER_LENGTH, decompress, encode_response, parse_infer_request
from app.errors import ModelNotFound, RequestError, ServeError
from app.core import Core, ModelDescription

log = logging.getLogger(__name__)

SERVER_NAME = "edgetpu-serve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "parameters"]


class V2Route(DoorRoute):
    """Every failure answered as the protocol says, without leaving the route."""

    @staticmethod
    def failure(request: Request, error: Exception) -> Response | None:
        if isinstance(error, ServeError):
            status = status_of(error)
            if status == REFUSED:
                refusals.refused(request.method, request.scope["path"], error)
            return JSONResponse({"error": str(error)}, status_code=status, headers=retry_after(error))
        if isinstance(error, (RequestValidationError, StarletteHTTPException)):
            return None  # the app's own handlers answer these with their 4xx
        # a bug: logged (summed up per kind), answered, connection kept
        log_bug(request, error)
        return JSONResponse({"error": f"internal error: {type(error).__name__}"}, status_code=500)


TAGS = ["v2 (Open Inference Protocol)"]
router = APIRouter(prefix="/v2", tags=TAGS, route_class=V2Route)
health = APIRouter(prefix="/v2/health", tags=TAGS, route_class=V2Route)


class V2InferenceRoute(V2Route):
    """The infer routes: the inference key checked first; inference routes of protocol "v2", a model of any task
    named in the path on its default backend (a body may name another: not read from the head), placed from the head
    only for the one version (another is the route's 404)."""

    checks = (check_inference_key,)
    inference = Inference("v2", only={"version": v2.VERSION})


inference = APIRouter(prefix="/v2", tags=TAGS, route_class=V2InferenceRoute)  # a door: app/api/doors.py


def _errors(*statuses: int) -> dict:
    return {status: {"model": ErrorResponse} for status in statuses}


MODEL_ERRORS = _errors(401, 404, 503)
INFER_ERRORS = _errors(400, 401, 404, 413, 503, 504)


def _model(core: Core, name: str, version: str | None) -> ModelDescription:
    """The model as the core describes it, while a version of it serves (NotReady otherwise)."""
    model = core.describe(name, serving=True)
    if version is not None and version != v2.VERSION:
        raise ModelNotFound(f"model {name!r} has no version {version!r}; versions: [{v2.VERSION!r}]")
    return model


def _requested(backend, admitted: str) -> str:
    if backend is None:
        return admitted
    if not isinstance(backend, str):
        raise RequestError(f"parameters.backend must be a string, got {backend!r}")
    return backend


def _limits(settings) -> v2.Limits:
    return v2.Limits(max_batch=settings.v2_max_batch, max_classification=settings.max_top_k)


@router.get("", summary="Server metadata")
async def server_metadata():
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


@health.get("/live", summary="The process answers")
async def live():
    return {"live": True}


@health.get("/ready", summary="Every model loaded and warmed up (503 otherwise)",
            responses={503: {"description": "{\"ready\": false}"}})
async def ready(core: CoreDep):
    is_ready = core.ready()
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/models/{name}", summary="Model metadata", responses=MODEL_ERRORS)
async def model_metadata(name: str, core: CoreDep):
    model = _model(core, name, None)
    return v2.model_metadata(model, model.backend)


@router.get("/models/{name}/versions/{version}", summary="Model metadata, one version", responses=MODEL_ERRORS)
async def version_metadata(name: str, version: str, core: CoreDep):
    model = _model(core, name, version)
    return v2.model_metadata(model, model.backend)


@router.get("/models/{name}/ready", summary="Model readiness (503 while it is not)", responses=MODEL_ERRORS)
async def model_ready(name: str, core: CoreDep):
    return _readiness(core, name, None)


@router.get("/models/{name}/versions/{version}/ready", summary="Model readiness, one version",
            responses=MODEL_ERRORS)
async def version_ready(name: str, version: str, core: CoreDep):
    return _readiness(core, name, version)


def _readiness(core: Core, name: str, version: str | None) -> JSONResponse:
    is_ready = core.status(name).state == "ready"
    if is_ready:
        _model(core, name, version)
    return JSONResponse({"name": name, "ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/models/{name}/config", summary="Model configuration (Triton's form; perf_analyzer reads it)",
            responses=MODEL_ERRORS)
async def model_config(name: str, core: CoreDep, settings: SettingsDep):
    model = _model(core, name, None)
    return v2.model_config(model, model.backend, _limits(settings))


@router.get("/models/{name}/versions/{version}/config", summary="Model configuration, one version",
            responses=MODEL_ERRORS)
async def version_config(name: str, version: str, core: CoreDep, settings: SettingsDep):
    model = _model(core, name, version)
    return v2.model_config(model, model.backend, _limits(settings))


INFER_DESCRIPTION = """The body is an Open Inference Protocol request: JSON, or JSON followed by binary tensors
(`Inference-Header-Content-Length`), optionally gzip or deflate (`Content-Encoding`). Input `image`:
UINT8 [N, H, W, C] (the model's input tensor) or BYTES [N] (encoded images). Outputs: the model's task's
(GET /v2/models/{name} lists them; a classifier's: `scores` (FP32) and `raw`); `parameters.classification = k`
on an output gives "score:index:label"."""


_PARAMETERS = {"type": "object", "additionalProperties": True}
INFER_REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": _PARAMETERS,
            "inputs": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "shape", "datatype"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "datatype": {"type": "string", "enum": sorted([*DTYPES, BYTES])},
                    "parameters": _PARAMETERS,
                    "data": {"description": "the elements, flat or nested; absent with parameters.binary_data_size"},
                }}},
            "outputs": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS}}},
        }}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                            "description": "the JSON part, then binary tensors "
                                                           "(Inference-Header-Content-Length)"}},
}}}


@inference.post("/models/{name}/infer", summary="Inference: tensors or encoded images in, scores out",
                description=INFER_DESCRIPTION, responses=INFER_ERRORS, openapi_extra=INFER_REQUEST_BODY)
async def model_infer(name: str, request: Request) -> Response:
    return await _infer(request, name, None)


@inference.post("/models/{name}/versions/{version}/infer", summary="Inference on one version",
                description=INFER_DESCRIPTION, responses=INFER_ERRORS, openapi_extra=INFER_REQUEST_BODY)
async def version_infer(name: str, version: str, request: Request) -> Response:
    return await _infer(request, name, version)


async def _infer(request: Request, name: str, version: str | None) -> Response:
    door = door_of(request)  # read here, not through Depends (bench/loop_cost.py)
    settings = door.settings
    if version is not None and version != v2.VERSION:
        raise ModelNotFound(f"model {name!r} has no version {version!r}; versions: [{v2.VERSION!r}]")
    # The room check before the body: a full line answers 503 whatever the body is doing.
    async with held(request, None, name, None) as hold:
        body = await read_limited(request, settings.max_body_bytes)
        encoding = request.headers.get("content-encoding")
        if encoding and encoding.strip().lower() != "identity":
            # the inflated copy is counted against the body budget too, at most the body limit
            held_more = await hold_more(request, settings.max_body_bytes)
            body = decompress(body, encoding, settings.max_body_bytes)
            if held_more is not None:
                held_more.shrink_to(held_more.size - settings.max_body_bytes + len(body))
        parsed = parse_infer_request(body, request.headers.get(HEADER_LENGTH))
        del body
        backend = _requested(parsed.parameters.get("backend"), hold.backend)
        outputs, parameters = await v2.infer(door.core, hold, backend, parsed, _limits(settings))
    content, headers = encode_response(hold.model, version or v2.VERSION, parsed.id, outputs, parameters)
    return Response(content, headers=headers)
