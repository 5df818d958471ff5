"""POST /v1/detect and /v1/models/{name}/detect: an image in, the objects in it out, boxes in the original
image's pixels. The detection task's native front door: parse the query, hold the model through the core
(app/core), read the body, get the task's answer (app/tasks/detect.py), send it as the task's schema says.

As /v1/classify: the hold (the model version, the room check) before the body is read, the place in line once
it is here; its route class, DetectRoute, a DirectRoute with the API key checked first, declares them
inference routes of protocol "v1" (shed, counted and admitted by app/api/routes.py's table). The model without a name: DEFAULT_DETECTION_MODEL.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY
from app.api.classify import BackendQuery
from app.api.direct import DirectRoute
from app.api.held import answer_image
from app.api.routes import Inference, v1_head
from app.api.schemas import V1_ERRORS
from app.tasks import Answer
from app.tasks.detect import TASK, DetectOptions, DetectResponse

# Fixed, part of the API's schema and checked before any work (docs/configuration.md's fixed limits): a detector
# gives at most its own N rows (100 for the SSD detectors); `labels` URL-encoded is at most 12 bytes a character,
# well inside the 16 KiB head cap.
MAX_DETECTIONS = 1000
MAX_LABELS_CHARS = 512


class DetectRoute(DirectRoute):
    """/v1 detect: the inference key checked first; inference routes of protocol "v1"."""

    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["detect"], route_class=DetectRoute)
INFERENCE_ROUTERS = (router,)  # app/api/doors.py
INFERENCE_RANK = 20  # the native routes first (app/api/doors.py)

ERRORS = V1_ERRORS
MinScore = Annotated[float | None, Query(ge=0.0, le=1.0, description="drop objects scoring below this (default: the "
                                         "model's, model.json detection.min_score, else 0.5)")]
MaxDetections = Annotated[int | None, Query(ge=1, le=MAX_DETECTIONS,
                                            description="at most this many objects, best first (default: the "
                                                        "model's, model.json detection.max_detections, else all "
                                                        "the model gives)")]
Labels = Annotated[str | None, Query(max_length=MAX_LABELS_CHARS, description="keep only these classes: labels (or "
                                     "class ids) separated by commas, e.g. person,car")]


def wanted_labels(labels: str | None) -> frozenset[str] | None:
    if labels is None:
        return None
    return frozenset(name.strip() for name in labels.split(",") if name.strip()) or None


async def _detect(request: Request, name: str | None, min_score: float | None, max_detections: int | None,
                  labels: str | None, backend: str | None) -> Response:
    answer = await answer_image(request, TASK, name, backend, DetectOptions(min_score, max_detections,
                                                                            wanted_labels(labels)))
    return Response(response_body(answer), media_type="application/json")


def response_body(answer: Answer) -> bytes:
    """The task's native answer, field for field as its schema says (the schema stays the contract: a field the
    result gains is not sent until the schema has it), straight from the dataclasses (orjson)."""
    return orjson.dumps(TASK.native(answer))


@router.post("/detect", response_model=DetectResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Detect objects with the default detection model")
async def detect_default(request: Request, min_score: MinScore = None, max_detections: MaxDetections = None,
                         labels: Labels = None, backend: BackendQuery = None) -> Response:
    return await _detect(request, None, min_score, max_detections, labels, backend)


@router.post("/models/{name}/detect", response_model=DetectResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Detect objects with a named detection model")
async def detect_named(name: str, request: Request, min_score: MinScore = None, max_detections: MaxDetections = None,
                       labels: Labels = None, backend: BackendQuery = None) -> Response:
    return await _detect(request, name, min_score, max_detections, labels, backend)
