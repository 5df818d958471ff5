"""POST /v1/classify and /v1/models/{name}/classify: an image in, the top-k classes out. The
classification task's routes (app/tasks/classify.py names this router; app/main.py includes it), and
`classify()`, one image through the core (app/inference.py) read by the task (app/tasks/classify.py).

Admission before work: the lease (the model version, and the room check on the pool's line) is
taken before the body is read, so a full line answers 503 at once, whatever the body is doing;
the place in line is taken once the body is here (a slow body holds none).

DirectRoutes (app/api/direct.py): the query parameters are validated from the signatures below
without FastAPI's dependency solving, after the API key check (first, as a dependency was). Inference
routes (app/api/routes.py): declared here, they are shed, counted and admitted by protocol "v1".
"""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY, image_bytes
from app.api.deps import named_or_default
from app.api.direct import DirectRoute
from app.api.metrics import counted
from app.api.routes import inference_route, v1_head_target
from app.api.schemas import ClassifyResponse, ErrorResponse
from app.errors import InvalidParameter
from app.inference import ImageWork, finish, run_image
from app.registry import Lease
from app.settings import CLASSIFICATION_DEFAULT
from app.tasks.classify import TASK, Classification

router = APIRouter(prefix="/v1", tags=["classify"],
                   route_class=inference_route(DirectRoute.checking(check_inference_key), "v1", v1_head_target))

ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 415, 422, 503, 504)}
TopK = Annotated[int, Query(ge=1, description="how many classes to return (at most EDGETPU_SERVE_MAX_TOP_K)")]
Threshold = Annotated[float, Query(ge=0.0, le=1.0, description="drop classes scoring below this")]
Backend = Annotated[str | None, Query(max_length=32, description="a backend key, as GET /v1/models lists "
                                                              "each model's; default: the first configured")]


async def _classify(request: Request, name: str | None, top_k: int, threshold: float,
                    backend: str | None) -> Response:
    # The app's state read here, not through Depends (bench/loop_cost.py).
    state = request.app.state
    registry, settings, images = state.registry, state.settings, state.images
    name = named_or_default(name, registry, settings, CLASSIFICATION_DEFAULT, "/v1/classify")
    if top_k > settings.max_top_k:
        raise InvalidParameter(f"top_k is {top_k}; at most {settings.max_top_k} (EDGETPU_SERVE_MAX_TOP_K)")
    async with registry.lease(name, backend, counted(request)) as lease:
        data = await image_bytes(request, settings.max_body_bytes)
        result = await classify(lease, data, top_k, threshold, images)
    # Serialized once here, straight from the dataclasses (orjson: ~4 us against ~40 us for
    # ClassifyResponse.model_validate + model_dump_json, same bytes); returning a Response skips
    # FastAPI's validation pass against response_model, which still documents the schema.
    return Response(response_body(result), media_type="application/json")


async def classify(lease: Lease, data: bytes, top_k: int, threshold: float, images: ImageWork) -> Classification:
    """One image through the leased model version (its place in line taken before its decode): its classes."""
    roles = lease.roles_for(TASK)
    model_dir = lease.model_dir
    ran = await run_image(lease, data, images)
    post_start = time.perf_counter()
    predictions = TASK.predictions(roles, ran.outputs, model_dir, top_k, threshold)
    return Classification(model=model_dir.name, backend=lease.backend, predictions=predictions,
                          timing_ms=finish(lease, ran, post_start), warmup=lease.warmup, cold=ran.cold)


def response_body(result: Classification) -> bytes:
    """ClassifyResponse's JSON, field for field (the schema stays the contract: a field the
    dataclass gains is not sent until the schema has it)."""
    return orjson.dumps({name: getattr(result, name) for name in ClassifyResponse.model_fields})


@router.post("/classify", response_model=ClassifyResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Classify an image with the default model")
async def classify_default(request: Request, top_k: TopK = 5, threshold: Threshold = 0.0,
                           backend: Backend = None) -> Response:
    return await _classify(request, None, top_k, threshold, backend)


@router.post("/models/{name}/classify", response_model=ClassifyResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Classify an image with a named model")
async def classify_named(name: str, request: Request, top_k: TopK = 5, threshold: Threshold = 0.0,
                         backend: Backend = None) -> Response:
    return await _classify(request, name, top_k, threshold, backend)
