"""POST /v1/pose and /v1/models/{name}/pose: an image in, a person's 17 keypoints out, in the original image's pixels.
The pose task's native front door: parse the query, hold the model through the core (app/core), read the body, get
the task's answer (app/tasks/pose.py), send it as the task's schema says.

As /v1/detect: the hold (the model version, the room check) before the body is read, the place in line once it
is here; DirectRoutes, the API key checked first; declared here as inference routes of protocol "v1" (shed,
counted and admitted by app/api/routes.py's table). The model without a name: DEFAULT_POSE_MODEL.
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
from app.tasks.pose import TASK, PoseResponse


class PoseRoute(DirectRoute):
    """/v1 pose: the inference key checked first; inference routes of protocol "v1"."""

    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["pose"], route_class=PoseRoute)
INFERENCE_ROUTERS = (router,)  # app/api/doors.py

ERRORS = V1_ERRORS


async def _pose(request: Request, name: str | None, backend: str | None) -> Response:
    answer = await answer_image(request, TASK, name, backend)
    return Response(orjson.dumps(TASK.native(answer)), media_type="application/json")


@router.post("/pose", response_model=PoseResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Estimate a person's pose with the default pose model")
async def pose_default(request: Request, backend: BackendQuery = None) -> Response:
    return await _pose(request, None, backend)


@router.post("/models/{name}/pose", response_model=PoseResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Estimate a person's pose with a named pose model")
async def pose_named(name: str, request: Request, backend: BackendQuery = None) -> Response:
    return await _pose(request, name, backend)
