"""POST /v1/detect and /v1/models/{name}/detect: an image in, the objects in it out, boxes in the original
image's pixels. The detection task's native routes (app/tasks/detect.py names this router; app/main.py includes it),
and `detect()`, one image through the core (app/inference.py) read by the task (app/tasks/detect.py), which
DeepStack's routes (app/api/deepstack.py) call too.

As /v1/classify: the lease (the model version, the room check) before the body is read, the place in line once
it is here; DirectRoutes, the API key checked first; declared here as inference routes of protocol "v1" (shed,
counted and admitted by app/api/routes.py's table). The model without a name: DEFAULT_DETECTION_MODEL.
"""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY, image_bytes
from app.api.classify import Backend
from app.api.deps import named_or_default
from app.api.direct import DirectRoute
from app.api.metrics import counted
from app.api.routes import inference_route, query_value
from app.api.schemas import DetectResponse, ErrorResponse
from app.inference import ImageWork, finish, run_image
from app.registry import Lease
from app.settings import DETECTION_DEFAULT
from app.tasks import detect as detection
from app.tasks.detect import Detection, ImageSize

# Fixed, part of the API's schema and checked before any work (docs/configuration.md's fixed limits): a detector
# gives at most its own N rows (100 for the SSD detectors); `labels` URL-encoded is at most 12 bytes a character,
# well inside the 16 KiB head cap.
MAX_DETECTIONS = 1000
MAX_LABELS_CHARS = 512


def detection_head_target(registry, parameters: dict[str, str], query: bytes) -> tuple[str, str | None]:
    """A detection route's head: the model (the path's `name`, or the default detector) and the `backend` query
    parameter, as its handler reads them."""
    return parameters.get("name") or registry.default_model(DETECTION_DEFAULT.task), query_value(query, "backend")


router = APIRouter(prefix="/v1", tags=["detect"],
                   route_class=inference_route(DirectRoute.checking(check_inference_key), "v1", detection_head_target))

ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 415, 422, 503, 504)}
MinScore = Annotated[float, Query(ge=0.0, le=1.0, description="drop objects scoring below this")]
MaxDetections = Annotated[int | None, Query(ge=1, le=MAX_DETECTIONS,
                                            description="at most this many objects, best first (default: all the "
                                                        "model gives)")]
Labels = Annotated[str | None, Query(max_length=MAX_LABELS_CHARS, description="keep only these classes: labels (or "
                                     "class ids) separated by commas, e.g. person,car")]


def wanted_labels(labels: str | None) -> frozenset[str] | None:
    if labels is None:
        return None
    return frozenset(name.strip() for name in labels.split(",") if name.strip()) or None


async def _detect(request: Request, name: str | None, min_score: float, max_detections: int | None,
                  labels: str | None, backend: str | None) -> Response:
    state = request.app.state
    registry, settings, images = state.registry, state.settings, state.images
    name = named_or_default(name, registry, settings, DETECTION_DEFAULT, "/v1/detect")
    async with registry.lease(name, backend, counted(request)) as lease:
        data = await image_bytes(request, settings.max_body_bytes)
        result = await detect(lease, data, images, min_score, max_detections, wanted_labels(labels))
    return Response(response_body(result), media_type="application/json")


async def detect(lease: Lease, data: bytes, images: ImageWork, min_score: float, max_detections: int | None = None,
                 labels: frozenset[str] | None = None) -> Detection:
    """One image through the leased detector: its objects scoring at least min_score, best first, at most
    max_detections, only those whose label is in `labels` (when given: a label the model lacks is a 400 before
    any work)."""
    roles = lease.roles_for(detection.TASK)
    model_dir = lease.model_dir
    wanted = None if labels is None else detection.class_ids(model_dir, labels)
    ran = await run_image(lease, data, images)
    post_start = time.perf_counter()
    found = detection.objects(roles, ran.outputs, ran.geometry, model_dir.labels, min_score, max_detections, wanted)
    return Detection(model=model_dir.name, backend=lease.backend, image=ImageSize(ran.geometry.width,
                     ran.geometry.height), detections=found, timing_ms=finish(lease, ran, post_start),
                     warmup=lease.warmup, cold=ran.cold)


def response_body(result: Detection) -> bytes:
    """DetectResponse's JSON, field for field, straight from the dataclasses (orjson)."""
    return orjson.dumps({name: getattr(result, name) for name in DetectResponse.model_fields})


@router.post("/detect", response_model=DetectResponse, responses=ERRORS, openapi_extra=OPENAPI_REQUEST_BODY,
             summary="Detect objects with the default detection model")
async def detect_default(request: Request, min_score: MinScore = 0.5, max_detections: MaxDetections = None,
                         labels: Labels = None, backend: Backend = None) -> Response:
    return await _detect(request, None, min_score, max_detections, labels, backend)


@router.post("/models/{name}/detect", response_model=DetectResponse, responses=ERRORS,
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Detect objects with a named detection model")
async def detect_named(name: str, request: Request, min_score: MinScore = 0.5, max_detections: MaxDetections = None,
                       labels: Labels = None, backend: Backend = None) -> Response:
    return await _detect(request, name, min_score, max_detections, labels, backend)
