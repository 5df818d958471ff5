"""DOODS' API, as Home Assistant's `doods` integration calls it (through pydoods): GET /detectors and POST /detect.

    GET  /detectors -> {"detectors": [{"name", "type", "model", "labels", "width", "height"}]}
         every detection model served, by its name, and the default detector once more as "default" (pydoods'
         default detector_name)
    POST /detect {"data": base64 image, "detector_name", "detect": {label: min_percent}, "regions": [...], "id"}
         -> {"id", "detections": [{"top", "left", "bottom", "right", "label", "confidence"}], "duration"}
         boxes as fractions of the image (box_normalized), confidence in percent, best first; kept as DOODS2
         filters them: a label listed at its minimum percent, any other at "*"'s, or inside a region with its own
         `detect` (`covers`: wholly inside)

The key: DOODS' header `doods-auth-key` carries one of the service's inference keys (app/api/auth.py), or the usual
headers do. Errors: {"id", "error"} with the status the other doors give (DOODS answers its own errors 400). The
detect route is an inference route of protocol "doods" (counted; its model is in the body, so it is admitted once
the body is read, not shed from the head).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.auth import check_inference_key, check_inference_key_value
from app.api.body import read_limited
from app.api.deps import door_of
from app.api.errors import log_answered, retry_after
from app.api.held import held
from app.api.json_image import REST_BYTES, SCRATCH_BYTES, Base64InPlace, Located, NotBase64, locate
from app.api.routes import DoorRoute, Inference
from app.core import ImageInput
from app.errors import RequestError, ServeError
from app.tasks.detect import TASK, DetectedObject, DetectOptions

KEY_HEADER = "doods-auth-key"
DEFAULT_NAME = "default"  # pydoods' detector_name when none is given
DETECTOR_TYPE = "tflite"  # DOODS' name for what runs these models


def check_doods_key(request: Request) -> None:
    """DOODS' header, else the usual ones: 401 unless one carries an inference key (nothing while none is set)."""
    if not door_of(request).keys.inference:
        return
    given = request.headers.get(KEY_HEADER)
    if given is None:
        check_inference_key(request)
    else:
        check_inference_key_value(request, given, f"the key in '{KEY_HEADER}' is not one of the service's API keys")


class DoodsRoute(DoorRoute):
    """Failures in DOODS' shape: {"error": ...} with the status the service gives the fault; DOODS' key checked
    first; inference routes of protocol "doods", whose model is in the body: the head cannot place a request
    (from_head=False), its room is checked once the body is read."""

    checks = (check_doods_key,)
    inference = Inference("doods", TASK, from_head=False)

    @staticmethod
    def failure(request: Request, error: Exception) -> Response | None:
        if isinstance(error, ServeError):
            log_answered(request, error, error.status)
            return _error(error.status, str(error), retry_after(error))
        if isinstance(error, StarletteHTTPException):
            return _error(error.status_code, str(error.detail), error.headers)
        if isinstance(error, RequestValidationError):
            return _error(400, "invalid request")
        return None


def _error(status: int, message: str, headers: dict | None = None, request_id: str | None = None) -> Response:
    return Response(orjson.dumps({"id": request_id, "error": message}), status_code=status,
                    media_type="application/json", headers=headers)


router = APIRouter(tags=["DOODS (Home Assistant)"], route_class=DoodsRoute)  # a door: app/api/doors.py


class Region(BaseModel):
    # strict, as the schema is: a number sent as a string is a client's mistake, not a number (lax pydantic would
    # take "50" for 50.0, and the schema would not describe what is accepted)
    model_config = ConfigDict(strict=True)

    top: float
    left: float
    bottom: float
    right: float
    detect: dict[str, float] = Field(default_factory=dict)
    covers: bool = False
    id: str | None = None


class DetectRequest(BaseModel):
    """DOODS2's request (its odrpc.DetectRequest); `image` (an annotated image back) and `preprocess` are not done."""

    model_config = ConfigDict(strict=True)

    id: str | None = None
    detector_name: str | None = None
    data: str = ""
    detect: dict[str, float] = Field(default_factory=dict)
    regions: list[Region] = Field(default_factory=list)


class DetectorOut(BaseModel):
    name: str
    type: str
    model: str
    labels: list[str]
    width: int
    height: int


class DetectorsOut(BaseModel):
    detectors: list[DetectorOut]


class DoodsDetection(BaseModel):
    top: float
    left: float
    bottom: float
    right: float
    label: str
    confidence: float = Field(description="percent")
    region_id: str | None = None


class DoodsResponse(BaseModel):
    id: str | None = None
    detections: list[DoodsDetection]
    duration: float = Field(description="ms")


@router.get("/detectors", response_model=DetectorsOut, summary="DOODS: the detectors served")
async def detectors(request: Request) -> Response:
    core = door_of(request).core
    default = core.default_model(TASK.name)
    found = []
    for name in core.models(TASK.name):
        model = core.describe(name)
        files = [entry.path for entry in model.files.values() if entry.path.endswith(".tflite")]
        entry = {"name": name, "type": DETECTOR_TYPE, "model": files[0] if files else name,
                 "labels": [label for label in core.labels(name) if label], "width": model.input["width"],
                 "height": model.input["height"]}
        found.append(entry)
        if name == default:
            found.append({**entry, "name": DEFAULT_NAME})
    return Response(orjson.dumps({"detectors": found}), media_type="application/json")


class DoodsError(BaseModel):
    id: str | None = None
    error: str


ERRORS = {status: {"model": DoodsError} for status in (400, 401, 404, 413, 415, 422, 503, 504)}
_THRESHOLDS = {"type": "object", "additionalProperties": {"type": "number"},
               "description": "label (or \"*\") -> the least confidence, in percent"}
DETECT_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "DOODS2's detect request (pydoods sends it)",
    "properties": {
        "id": {"type": "string"},
        "detector_name": {"type": "string", "description": "a detector of GET /detectors; default: the default"},
        "data": {"type": "string", "contentEncoding": "base64", "description": "the image, base64-encoded"},
        "detect": _THRESHOLDS,
        "regions": {"type": "array", "items": {
            "type": "object", "required": ["top", "left", "bottom", "right"],
            "properties": {**{side: {"type": "number", "description": "a fraction of the image"}
                              for side in ("top", "left", "bottom", "right")},
                           "detect": _THRESHOLDS, "covers": {"type": "boolean"}, "id": {"type": "string"}}}},
    }}}}}}


@router.post("/detect", response_model=DoodsResponse, responses=ERRORS, openapi_extra=DETECT_BODY,
             summary="DOODS: detect objects in a base64 image")
async def doods_detect(request: Request) -> Response:
    arrived = time.perf_counter()
    settings = door_of(request).settings
    # the body holds the image as base64: 4/3 of MAX_BODY_BYTES, and the request around it
    # with what decoding holds beside it (app/api/json_image.py)
    body = await read_limited(request, settings.max_body_bytes * 4 // 3 + REST_BYTES, scratch=SCRATCH_BYTES)
    located = locate(body)
    try:
        asked = DetectRequest.model_validate_json(located.rest)
    except ValidationError as e:
        raise RequestError(f"not DOODS' detect request: {e.errors()[0]['msg']} at "
                           f"{'.'.join(str(p) for p in e.errors()[0]['loc']) or 'the body'}") from None
    image = await decoded_in_place(body, located)
    if not image:
        raise RequestError("data: no image")
    name = asked.detector_name if asked.detector_name not in (None, "", DEFAULT_NAME) else None
    thresholds = [*asked.detect.values(), *(v for r in asked.regions for v in r.detect.values())]
    options = DetectOptions(min_score=min(max(0.0, min(thresholds, default=100) / 100), 1.0))
    async with held(request, TASK, name, None) as hold:
        answer = await door_of(request).core.answer(hold, ImageInput(image), options)
    kept = filtered(answer.result.detections, asked.detect, asked.regions)
    return Response(orjson.dumps({"id": asked.id, "detections": kept,
                                  "duration": round((time.perf_counter() - arrived) * 1000, 3)}),
                    media_type="application/json")


async def decoded_in_place(body: bytearray, located: Located) -> bytearray:
    """The image: the body itself, its base64 text decoded into it (the request's own buffer, as the body was),
    the event loop handed back between chunks. Empty where the request has no `data` string."""
    if located.start < 0:
        return bytearray()
    decoding = Base64InPlace(body, located.start, located.end)
    try:
        while decoding.step():
            await asyncio.sleep(0)
    except NotBase64 as e:
        raise RequestError(f"data: not base64 ({e}); DOODS takes the image base64-encoded") from None
    return body


def filtered(objects: list[DetectedObject], detect: dict[str, float], regions: list[Region]) -> list[dict[str, Any]]:
    """DOODS2's filter (doods.py filter_detections), best first: a label listed in `detect` at its minimum percent,
    any other at "*"'s; else inside a region (`covers`: wholly, otherwise touching) at the region's own minimum."""
    kept = []
    for o in objects:
        box = o.box_normalized
        found = {"top": box.y_min, "left": box.x_min, "bottom": box.y_max, "right": box.x_max, "label": o.label,
                 "confidence": o.score * 100}
        if _passes(found, detect):
            kept.append(found)
            continue
        for region in regions:
            inside = (region.top <= found["top"] and region.left <= found["left"] and region.bottom >= found["bottom"]
                      and region.right >= found["right"]) if region.covers else (
                found["top"] <= region.bottom and found["left"] <= region.right and found["bottom"] >= region.top
                and found["right"] >= region.left)
            if inside and _passes(found, region.detect):
                kept.append({**found, "region_id": region.id})
                break
    return kept


def _passes(found: dict, detect: dict[str, float]) -> bool:
    wanted = detect.get(found["label"], detect.get("*"))
    return wanted is not None and found["confidence"] >= wanted
