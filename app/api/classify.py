"""POST /v1/classify and /v1/models/{name}/classify: an image in, the top-k classes out. The classification task's
native front door: parse the query, hold the model through the core (app/core), read the body, get the task's
answer (app/tasks/classify.py), send it as the task's schema says.

Admission before work: the hold (the model version, and the room check on the pool's line) comes before the body
is read, so a full line answers 503 at once, whatever the body is doing; the place in line is taken once the
body is here (a slow body holds none).

Its route class, ClassifyRoute: a DirectRoute (app/api/direct.py), the query parameters validated from the
signatures below without FastAPI's dependency solving, after the API key check (first, as a dependency was); and
inference routes of protocol "v1" (app/api/routes.py): declared here, they are shed, counted and admitted.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY
from app.api.deps import door_of
from app.api.direct import DirectRoute
from app.api.held import answer_image
from app.api.routes import Inference, v1_head
from app.api.schemas import V1_ERRORS
from app.errors import InvalidParameter
from app.tasks import Answer
from app.tasks.classify import TASK, ClassifyOptions, ClassifyResponse


class ClassifyRoute(DirectRoute):
    """/v1 classify: the inference key checked first; inference routes of protocol "v1"."""

    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["classify"], route_class=ClassifyRoute)
INFERENCE_ROUTERS = (router,)  # app/api/doors.py
INFERENCE_RANK = 10  # the native routes first (app/api/doors.py)

ERRORS = V1_ERRORS
TopK = Annotated[int, Query(ge=1, description="how many classes to return (at most EDGETPU_SERVE_MAX_TOP_K)")]
Threshold = Annotated[float, Query(ge=0.0, le=1.0, description="drop classes scoring below this")]
BackendQuery = Annotated[str | None, Query(max_length=32, description="a backend key, as GET /v1/models lists "
                                                                   "each model's; default: the first configured")]


async def _classify(request: Request, name: str | None, top_k: int, threshold: float,
                    backend: str | None) -> Response:
    # The settings read here, not through Depends (bench/loop_cost.py).
    settings = door_of(request).settings
    if top_k > settings.max_top_k:
        raise InvalidParameter(f"top_k is {top_k}; at most {settings.max_top_k} (EDGETPU_SERVE_MAX_TOP_K)")
    answer = await answer_image(request, TASK, name, backend, ClassifyOptions(top_k, threshold))
    # Serialized once here, straight from the dataclasses (orjson: ~4 us against ~40 us for
    # ClassifyResponse.model_validate + model_dump_json, same bytes); returning a Response skips
    # FastAPI's validation pass against response_model, which still documents the schema.
    return Response(response_body(answer), media_type="application/json")


def response_body(answer: Answer) -> bytes:
    """The task's native answer, field for field as its schema says (the schema stays the contract: a field the
    result gains is not sent until the schema has it), straight from the dataclasses (orjson)."""
    return orjson.dumps(TASK.native(answer))


@router.post("/classify", response_model=ClassifyResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Classify an image with the default model")
async def classify_default(request: Request, top_k: TopK = 5, threshold: Threshold = 0.0,
                           backend: BackendQuery = None) -> Response:
    return await _classify(request, None, top_k, threshold, backend)


@router.post("/models/{name}/classify", response_model=ClassifyResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Classify an image with a named model")
async def classify_named(name: str, request: Request, top_k: TopK = 5, threshold: Threshold = 0.0,
                         backend: BackendQuery = None) -> Response:
    return await _classify(request, name, top_k, threshold, backend)
