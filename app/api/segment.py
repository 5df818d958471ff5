"""POST /v1/segment and /v1/models/{name}/segment: an image in, the class of every pixel out. The segmentation task's
native front door: parse the query, hold the model through the core (app/core), read the body, get the task's
answer (app/tasks/segment.py), send it as JSON (the classes present, their share of the image) or, with
`?format=png`, the mask itself: a PNG at the original image's size whose pixel values are the class ids.

As /v1/detect: the hold (the model version, the room check) before the body is read, the place in line once it
is here; DirectRoutes, the API key checked first; declared here as inference routes of protocol "v1" (shed,
counted and admitted by app/api/routes.py's table). The model without a name: DEFAULT_SEGMENTATION_MODEL.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY
from app.api.classify import BackendQuery
from app.api.direct import DirectRoute
from app.api.held import answer_image
from app.api.routes import Inference, v1_head
from app.api.schemas import V1_ERRORS
from app.tasks import Answer
from app.tasks.segment import TASK, SegmentResponse


class SegmentRoute(DirectRoute):
    """/v1 segment: the inference key checked first; inference routes of protocol "v1"."""

    checks = (check_inference_key,)
    inference = Inference("v1", v1_head(TASK))


router = APIRouter(prefix="/v1", tags=["segment"], route_class=SegmentRoute)
INFERENCE_ROUTERS = (router,)  # app/api/doors.py

ERRORS = V1_ERRORS
PNG = {"content": {"image/png": {}}, "description": "with format=png: the mask, one byte per pixel whose value is "
                                                    "the class id (255: not seen), at the original image's size"}
Format = Annotated[Literal["json", "png"], Query(description="json: the classes present and their share of the "
                                                            "image; png: the mask")]


async def _segment(request: Request, name: str | None, format: str, backend: str | None) -> Response:
    answer = await answer_image(request, TASK, name, backend)
    if format == "json":
        return Response(orjson.dumps(TASK.native(answer)), media_type="application/json")
    return await png_response(answer)


async def png_response(answer: Answer) -> Response:
    """The mask as PNG, made off the event loop; the answer's timings (and the PNG's own, `png`) in X-Timing-Ms."""
    start = time.perf_counter()
    data = await run_in_threadpool(answer.result.png)
    timing = {**answer.timing_ms, "png": (time.perf_counter() - start) * 1000}
    return Response(data, media_type="image/png", headers={
        "X-Model": answer.model, "X-Backend": answer.backend, "X-Timing-Ms": orjson.dumps(timing).decode()})


@router.post("/segment", response_model=SegmentResponse, responses={**ERRORS, 200: PNG},
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Segment an image with the default segmentation model")
async def segment_default(request: Request, format: Format = "json", backend: BackendQuery = None) -> Response:
    return await _segment(request, None, format, backend)


@router.post("/models/{name}/segment", response_model=SegmentResponse, responses={**ERRORS, 200: PNG},
             openapi_extra=OPENAPI_REQUEST_BODY, summary="Segment an image with a named segmentation model")
async def segment_named(name: str, request: Request, format: Format = "json", backend: BackendQuery = None) -> Response:
    return await _segment(request, name, format, backend)
