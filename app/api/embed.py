"""POST /v1/embed and /v1/models/{name}/embed: an image in, its embedding out (the model's output vector,
dequantized and L2-normalized). The embedding task's native front door: parse the query, hold the model through the
core (app/core), read the body, get the task's answer (app/tasks/embed.py), send it as the task's schema says.

As /v1/pose: the hold (the model version, the room check) before the body is read, the place in line once it is
here; DirectRoutes, the API key checked first; declared here as inference routes of protocol "v1" (shed, counted and
admitted by app/api/routes.py's table). The model without a name: the only embedding model served (a request names
one where several are).
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY
from app.api.classify import BackendQuery
from app.api.direct import DirectRoute
from app.api.held import answer_image
from app.api.routes import Inference, v1_head
from app.api.schemas import V1_ERRORS
from app.tasks.embed import TASK, EmbedResponse


class EmbedRoute(DirectRoute):
    """/v1 embed: the inference key checked first; inference routes of protocol "v1"."""

    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["embed"], route_class=EmbedRoute)
INFERENCE_ROUTERS = (router,)  # app/api/doors.py

ERRORS = V1_ERRORS


async def _embed(request: Request, name: str | None, backend: str | None) -> Response:
    answer = await answer_image(request, TASK, name, backend)
    # the vector as float32 values, each in its shortest form (orjson's numpy serialization)
    return Response(orjson.dumps(TASK.native(answer), option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


@router.post("/embed", response_model=EmbedResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Embed an image with the default embedding model")
async def embed_default(request: Request, backend: BackendQuery = None) -> Response:
    return await _embed(request, None, backend)


@router.post("/models/{name}/embed", response_model=EmbedResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Embed an image with a named embedding model")
async def embed_named(name: str, request: Request, backend: BackendQuery = None) -> Response:
    return await _embed(request, name, backend)
