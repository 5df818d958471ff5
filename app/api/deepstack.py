"""DeepStack's detection API, as Home Assistant, Blue Iris, Agent DVR, Frigate and CodeProject.AI's clients call it:
POST /v1/vision/detection (the default detector) and /v1/vision/custom/{name} (any detector served).

Request: multipart field `image` (a raw image body is taken too), optional form fields `min_confidence` (default:
the model's threshold, model.json detection.min_score, else DeepStack's 0.45; DeepStack's 400s for a value that is
no number or above 1) and `api_key`. The key: the service's API keys
(docs/security.md), sent as DeepStack's clients do, as the form field `api_key`, or in a header as on every other
route; a wrong one is DeepStack's 401 "Incorrect api key".
Answer: {"success": true, "predictions": [{"label", "confidence", "x_min", "y_min", "x_max", "y_max"}], "duration"}
with integer boxes in the original image's pixels, best first, plus CodeProject.AI's fields (message, count,
inferenceMs, processMs, analysisRoundTripMs, moduleId, moduleName, command, executionProvider, timestampUTC).
Errors: {"success": false, "error": "...", "duration": 0} with DeepStack's statuses: 400 for anything wrong with the
request (where /v1 says 415 or 422 too), 401 for the key, 404 for a model not served, 413 for a body or image too
large, 503 (Retry-After) when the line is full or the model not ready, 504 for an invoke past its deadline, on
every path, refusals from the request head included (app/api/routes.py error_fields). Nothing a client sends
makes a 500; a bug still answers in this shape.

Inference routes of protocol "deepstack" (app/api/routes.py): shed, counted and admitted like /v1's.
"""

from __future__ import annotations

import logging
import math
import time
from email.utils import formatdate

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.auth import check_inference_key_value, inference_key_in_head
from app.api.body import IMAGE_FIELD, image_and_fields
from app.api.deps import door_of
from app.api.errors import log_answered, log_bug, retry_after
from app.api.held import held
from app.api.routes import BackendQuery, DoorRoute, Inference
from app.api.schemas import DeepStackError, DeepStackResponse
from app.core import ImageInput
from app.errors import RequestError, ServeError
from app.tasks import Answer
from app.tasks.detect import TASK, Detection, DetectOptions

log = logging.getLogger(__name__)

DEFAULT_MIN_CONFIDENCE = 0.45  # DeepStack's clients' default (deepstack-python, Home Assistant)
KEY_FIELD, CONFIDENCE_FIELD = "api_key", "min_confidence"
MODULE_ID = "edgetpu-serve"
# Where /v1 answers a status DeepStack's clients do not expect: what DeepStack says instead.
INSTEAD = {415: 400, 422: 400, 409: 503}
# DeepStack's error body beside "error" (its ErrorResponse: success, error, duration)
FAILED = {"success": False, "duration": 0}


def failure(status: int, message: str, headers: dict | None = None) -> Response:
    return Response(orjson.dumps({"success": False, "error": message, "duration": 0}), status_code=status,
                    media_type="application/json", headers=headers)


class DeepStackRoute(DoorRoute):
    """Every failure in DeepStack's shape and statuses, without leaving the route (CodeProject.AI's routes beside
    these answer so too: app/api/codeproject.py). No key check first: the key may come in the body (the handler
    checks it)."""

    instead = INSTEAD  # the statuses DeepStack's clients get instead of the service's

    @classmethod
    def failure(cls, request: Request, error: Exception) -> Response:
        if isinstance(error, ServeError):
            status = cls.instead.get(error.status, error.status)
            log_answered(request, error, status)
            return failure(status, str(error), retry_after(error))
        if isinstance(error, RequestValidationError):
            return failure(400, "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}"
                                          for e in error.errors()) or "invalid request")
        if isinstance(error, StarletteHTTPException):
            return failure(error.status_code, str(error.detail), error.headers)
        log_bug(request, error)  # a bug: logged (summed up per kind), answered in the protocol's shape
        return failure(500, f"internal error: {type(error).__name__}")


class DeepStackDetectionRoute(DeepStackRoute):
    """DeepStack's detection routes: inference routes of protocol "deepstack", their refusals from the head in
    DeepStack's shape too."""

    inference = Inference("deepstack", TASK, error_fields=FAILED)


router = APIRouter(prefix="/v1/vision", tags=["DeepStack (detection)"], route_class=DeepStackDetectionRoute)

ERRORS = {status: {"model": DeepStackError} for status in (400, 401, 404, 413, 503, 504)}
OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "description": "DeepStack's form: the image, and optionally the minimum confidence and the API key.",
        "content": {"multipart/form-data": {"schema": {
            "type": "object", "required": [IMAGE_FIELD],
            "properties": {IMAGE_FIELD: {"type": "string", "format": "binary"},
                           # a number at most 1, or empty for the default (as DeepStack reads it)
                           CONFIDENCE_FIELD: {"anyOf": [{"type": "number", "maximum": 1}, {"type": "string",
                                                                                           "maxLength": 0}],
                                              "default": DEFAULT_MIN_CONFIDENCE},
                           # any text: a form field is text whatever it looks like (a key that reads as a number
                           # is a key), so no type to violate
                           KEY_FIELD: {"description": "one of the service's API keys, when keys are set"}}}}},
    }
}


def min_confidence(value: str | None) -> float | None:
    """The form field as DeepStack reads it: unset or empty, None (the model's threshold, else DeepStack's default);
    no number or above 1, a 400."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isnan(number):
        raise RequestError(f"Invalid value for min_confidence: {value[:40]!r} (a number, at most 1)")
    if number > 1:
        raise RequestError(f"min_confidence cannot be greater than 1 (got {value[:40]})")
    return max(number, 0.0)


async def _vision(request: Request, name: str | None, backend: str | None, command: str) -> Response:
    arrived = time.perf_counter()
    core = door_of(request).core
    keyed = inference_key_in_head(request)  # else the key comes as the form field, checked once it is read
    async with held(request, TASK, name, backend) as hold:
        data, fields = await image_and_fields(request, door_of(request).settings.max_body_bytes,
                                              (KEY_FIELD, CONFIDENCE_FIELD))
        if not keyed:
            check_inference_key_value(request, fields.get(KEY_FIELD), "Incorrect api key: send one of the service's "
                                      "API keys as the form field 'api_key' or as 'Authorization: Bearer <key>'")
        options = DetectOptions(min_confidence(fields.get(CONFIDENCE_FIELD)), default_min_score=DEFAULT_MIN_CONFIDENCE)
        answer = await core.answer(hold, ImageInput(data), options)
    provider = core.provider(answer.backend)
    return Response(response_body(answer, command, provider, (time.perf_counter() - arrived) * 1000),
                    media_type="application/json")


def response_body(answer: Answer[Detection], command: str, provider: str, round_trip_ms: float) -> bytes:
    """DeepStack's answer with CodeProject.AI's fields; boxes rounded to whole pixels; `provider` is the
    backend's kind of processor (its plug-in's execution_provider)."""
    timing = answer.timing_ms
    predictions = [{"label": o.label, "confidence": o.score,
                    "x_min": int(o.box.x_min + 0.5), "y_min": int(o.box.y_min + 0.5),
                    "x_max": int(o.box.x_max + 0.5), "y_max": int(o.box.y_max + 0.5)}
                   for o in answer.result.detections]
    labels = [p["label"] for p in predictions]
    return orjson.dumps({
        "success": True,
        "message": f"Found {', '.join(labels)}" if labels else "No objects found",
        "count": len(predictions),
        "predictions": predictions,
        "duration": round(round_trip_ms, 3),
        "inferenceMs": round(timing["inference"]),
        "processMs": round(timing["total"] - timing["queue"]),
        "analysisRoundTripMs": round(round_trip_ms),
        "moduleId": MODULE_ID,
        "moduleName": f"{MODULE_ID}: {answer.model} on {answer.backend}",
        "command": command,
        "executionProvider": provider,
        "timestampUTC": formatdate(usegmt=True),
    })


@router.post("/detection", response_model=DeepStackResponse, responses=ERRORS, openapi_extra=OPENAPI_BODY,
             summary="DeepStack's object detection, with the default detection model")
async def vision_detection(request: Request, backend: BackendQuery = None) -> Response:
    return await _vision(request, None, backend, "detect")


@router.post("/custom/{name}", response_model=DeepStackResponse, responses=ERRORS, openapi_extra=OPENAPI_BODY,
             summary="DeepStack's custom model detection, with a named detection model")
async def vision_custom(name: str, request: Request, backend: BackendQuery = None) -> Response:
    return await _vision(request, name, backend, "custom")
