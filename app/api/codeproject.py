"""What Blue Iris (and Agent DVR) call beside DeepStack's detection routes to find and use a CodeProject.AI server
(CodeProject.AI's API reference; the calls xnorpx/blue-onyx, a server Blue Iris uses, answers):

    POST /v1/vision/custom/list     -> {"success": true, "models": [...], ...}: the custom models Blue Iris offers
                                       for /v1/vision/custom/{model} (every detection model served)
    GET  /v1/status/updateavailable -> {"success": true, "updateAvailable": false, "current": ..., "latest": ...}

Detection itself is DeepStack's /v1/vision/detection and /v1/vision/custom/{name} (app/api/deepstack.py). The list
route is matched before DeepStack's /v1/vision/custom/{name} (app/api/doors.py puts this door first). The key, as
on DeepStack's routes: in a header, or as the form field `api_key`.
"""

from __future__ import annotations

import time
from email.utils import formatdate

import orjson
from fastapi import APIRouter, Request, Response
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

from app.api.auth import check_inference_key_value, inference_key_in_head
from app.api.body import read_limited
from app.api.deepstack import DeepStackRoute, KEY_FIELD, MODULE_ID
from app.api.deps import door_of
from app.errors import RequestError
from app.tasks.detect import TASK

VERSION = (0, 1, 0)  # pyproject.toml's version of the service
LIST_BODY_BYTES = 64 * 1024  # a list request carries at most its form fields

# a door (app/api/doors.py) before DeepStack's, whose /v1/vision/custom/{name} would take /v1/vision/custom/list;
# its routes run no model: not inference routes
router = APIRouter(prefix="/v1", tags=["CodeProject.AI (Blue Iris)"], route_class=DeepStackRoute)


def _version() -> dict:
    major, minor, patch = VERSION
    return {"major": major, "minor": minor, "patch": patch, "preRelease": None, "securityUpdate": False, "build": 0,
            "file": "", "releaseNotes": ""}


@router.post("/vision/custom/list", summary="CodeProject.AI: the custom (detection) models served")
async def custom_list(request: Request) -> Response:
    arrived = time.perf_counter()
    if not inference_key_in_head(request):
        fields = await _form_fields(bytes(await read_limited(request, LIST_BODY_BYTES)), request)
        check_inference_key_value(request, fields.get(KEY_FIELD), "Incorrect api key: send one of the service's "
                                  "API keys as the form field 'api_key' or as 'Authorization: Bearer <key>'")
    core = door_of(request).core
    return Response(orjson.dumps({
        "success": True, "models": core.models(TASK.name), "message": "", "moduleId": MODULE_ID,
        "moduleName": MODULE_ID, "command": "list", "statusData": None,
        "inferenceDevice": core.provider(core.backends()[0]),
        "analysisRoundTripMs": round((time.perf_counter() - arrived) * 1000),
        "processedBy": MODULE_ID, "timestampUTC": formatdate(usegmt=True)}), media_type="application/json")


@router.get("/status/updateavailable", summary="CodeProject.AI: whether an update is available (never, here)")
async def update_available() -> Response:
    return Response(orjson.dumps({"success": True, "message": "", "version": None, "current": _version(),
                                  "latest": _version(), "updateAvailable": False}), media_type="application/json")


async def _form_fields(body: bytes, request: Request) -> dict[str, str]:
    """The text fields of a small form body already read (multipart or urlencoded; none from another body)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    parser = {"multipart/form-data": MultiPartParser, "application/x-www-form-urlencoded": FormParser}.get(media_type)
    if parser is None or not body:
        return {}

    async def stream():
        yield body

    try:
        form = await (parser(request.headers, stream(), max_files=1, max_fields=16) if parser is MultiPartParser
                      else parser(request.headers, stream())).parse()
    except MultiPartException as e:
        raise RequestError(f"malformed multipart body: {e.message}") from None
    try:
        return {name: value for name, value in form.items() if isinstance(value, str)}
    finally:
        await form.close()
