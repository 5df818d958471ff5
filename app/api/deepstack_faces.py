"""DeepStack's face API, as its clients call it (deepstack-python's DeepstackFace in Home Assistant, Double Take,
Agent DVR, Blue Iris, node-red-contrib-deepstack; CodeProject.AI serves the same routes):

    POST /v1/vision/face            image [min_confidence]  -> predictions: confidence, x_min, y_min, x_max, y_max
    POST /v1/vision/face/register   userid, image [image1 ...]  -> message "face added" (the largest face of each)
    POST /v1/vision/face/recognize  image [min_confidence]  -> predictions: userid ("unknown"), confidence, box
    POST /v1/vision/face/list                               -> faces: the userids
    POST /v1/vision/face/delete     userid                  -> success
    POST /v1/vision/face/match      image1, image2          -> similarity (DeepStack's (cosine + 1) / 2), cosine,
                                                               confidence (calibrated)
    POST /v1/backup                 admin key               -> the gallery, one SQLite file (app/faces/backup.py)
    POST /v1/restore                file, admin key         -> the gallery replaced by the file, whole or not at all

Keys as DeepStack's clients send them: the form field `api_key` (or a header) on every route while inference keys
are set; an admin key (form field `admin_key`, or `api_key`, or a header) for backup and restore always, and for
register and delete with FACE_EDITS_NEED_ADMIN. Answers: {"success": true, ...}; failures {"success": false,
"error": "...", "duration": 0} with DeepStack's statuses: 400 for anything wrong with the request (no face, an
unknown or invalid userid, a missing field, not an image), 401 for a key, 413 for a body too large, 503 while the
face models are not set or served (the error says the fix) or a line is full. Nothing a client sends makes a 500.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from app.api.auth import check_admin_key_value, check_inference_key_value, inference_key_in_head
from app.api.deepstack import MODULE_ID, DeepStackRoute, min_confidence
from app.api.deps import door_of
from app.api.face_forms import FaceForm, read_face_form
from app.api.face_schemas import (DEEPSTACK_ERRORS, PHOTO, FaceDetectAnswer, FaceListAnswer, FaceMatchAnswer,
                                  FaceRecognizeAnswer, FaceRegisterAnswer, DeepStackAnswer, form)
from app.core.face_photos import Face
from app.core.faces import Faces
from app.errors import RequestError

KEY, ADMIN_KEY, USERID, CONFIDENCE = "api_key", "admin_key", "userid", "min_confidence"
# DeepStack's clients read 404 as a wrong URL and 409 as nothing they know: a request's fault is their 400
INSTEAD = {404: 400, 409: 400, 415: 400, 422: 400}
BACKUP_NAME = "faces-backup.db"
CONFIDENCE_FIELD = {"anyOf": [{"type": "number", "maximum": 1}, {"type": "string", "maxLength": 0}]}
USERID_FIELD = {"type": "string", "minLength": 1}
BACKUP_FILE = {200: {"description": "the gallery, one SQLite file", "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


class FaceRoute(DeepStackRoute):
    """Every failure in DeepStack's shape, with the face routes' statuses."""

    instead = INSTEAD


router = APIRouter(prefix="/v1", tags=["DeepStack (faces)"], route_class=FaceRoute)


async def _form(request: Request, admin: bool = False) -> tuple[Faces, FaceForm]:
    """The form, read within the body limit, the key it needs checked (the admin key where `admin`), and the face
    models served."""
    door = door_of(request)
    keyed = not admin and inference_key_in_head(request)
    form = await read_face_form(request, door.settings.max_body_bytes)
    if admin:
        check_admin_key_value(request, form.text(ADMIN_KEY), form.text(KEY))
    elif not keyed:
        check_inference_key_value(request, form.text(KEY) or form.text(ADMIN_KEY), "Incorrect api key: send one of "
                                  "the service's API keys as the form field 'api_key' or as 'Authorization: Bearer "
                                  "<key>'")
    faces = door.service.faces
    faces.models.pair()  # while the face models are not set: the 503 with the fix, before the form's own faults
    return faces, form


def _edits_need_admin(request: Request) -> bool:
    return door_of(request).settings.face_edits_need_admin


def _userid(form: FaceForm) -> str:
    userid = form.text(USERID)
    if userid is None or not userid.strip():
        raise RequestError("user id not specified: send the form field 'userid'")
    return userid


def _answer(body: dict, command: str, arrived: float) -> Response:
    duration = (time.perf_counter() - arrived) * 1000
    return Response(orjson.dumps({"success": True, **body, "duration": round(duration, 3), "command": command,
                                  "moduleId": MODULE_ID, "analysisRoundTripMs": round(duration),
                                  "timestampUTC": formatdate(usegmt=True)}), media_type="application/json")


def _box(face: Face) -> dict:
    left, top, right, bottom = face.box
    return {"x_min": int(left + 0.5), "y_min": int(top + 0.5), "x_max": int(right + 0.5), "y_max": int(bottom + 0.5)}


@router.post("/vision/face", summary="DeepStack: the faces in a photo", response_model=FaceDetectAnswer,
             responses=DEEPSTACK_ERRORS, openapi_extra=form("the photo", ("image",), image=PHOTO,
                                                          min_confidence=CONFIDENCE_FIELD))
@router.post("/vision/face/", include_in_schema=False)  # some clients end the URL with a slash
async def face_detect(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request)
    found = await faces.detect(form.file("image"), min_confidence(form.text(CONFIDENCE)))
    predictions = [{"confidence": face.confidence, **_box(face)} for face in found]
    return _answer({"message": f"Found {len(predictions)} face(s)" if predictions else "No faces found",
                    "count": len(predictions), "predictions": predictions}, "detect", arrived)


@router.post("/vision/face/register", summary="DeepStack: register a person's face (the largest in each photo)",
             response_model=FaceRegisterAnswer, responses=DEEPSTACK_ERRORS, openapi_extra=form(
                 "the userid and their photos (every file of the form: image, image1, ...)", ("userid", "image"),
                 userid=USERID_FIELD, image=PHOTO, image1=PHOTO))
async def face_register(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request, admin=_edits_need_admin(request))
    userid = _userid(form)
    images = form.images()
    if not images:
        raise RequestError("No valid image file found: send the photo as the multipart file field 'image' (more "
                           "as 'image1', 'image2', ...)")
    # added to the person's faces, not replacing them: Double Take, Viseron and Home Assistant train one photo a
    # request, and DeepStack's replacing kept only the last of a person's photos (docs/faces.md)
    enrolment = await faces.register(userid, images, replace=False)
    message = "face added"
    if enrolment.registration.held:
        message += f"; {enrolment.registration.held} of the faces were registered for {userid!r} already"
    if enrolment.crowded:
        which = ", ".join(str(i + 1) for i in enrolment.crowded)
        message += f"; image(s) {which} held several faces: the largest of each was registered"
    return _answer({"message": message, "userid": enrolment.registration.userid,
                    "faces": enrolment.registration.faces}, "register", arrived)


@router.post("/vision/face/recognize", summary="DeepStack: who the faces in a photo are",
             response_model=FaceRecognizeAnswer, responses=DEEPSTACK_ERRORS, openapi_extra=form(
                 "the photo", ("image",), image=PHOTO, min_confidence=CONFIDENCE_FIELD))
async def face_recognize(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request)
    found = await faces.recognize(form.file("image"), min_confidence(form.text(CONFIDENCE)))
    predictions = [{"userid": face.userid, "confidence": face.confidence, **_box(face.face)} for face in found]
    names = [p["userid"] for p in predictions]
    return _answer({"message": f"Found {', '.join(names)}" if names else "No known faces", "count": len(names),
                    "predictions": predictions}, "recognize", arrived)


@router.post("/vision/face/list", summary="DeepStack: the registered userids", response_model=FaceListAnswer,
             responses=DEEPSTACK_ERRORS, openapi_extra=form("the key, if keys are set"))
async def face_list(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, _ = await _form(request)
    people = await faces.people()
    return _answer({"faces": [person.userid for person in people], "count": len(people)}, "list", arrived)


@router.post("/vision/face/delete", summary="DeepStack: delete a person and their faces",
             response_model=DeepStackAnswer, responses=DEEPSTACK_ERRORS,
             openapi_extra=form("the userid", ("userid",), userid=USERID_FIELD))
async def face_delete(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request, admin=_edits_need_admin(request))
    deletion = await faces.delete(_userid(form))
    return _answer({"message": f"deleted {deletion.userid!r} ({deletion.faces} face(s))"}, "delete", arrived)


@router.post("/vision/face/match", summary="DeepStack: how alike the faces of two photos are",
             response_model=FaceMatchAnswer, responses=DEEPSTACK_ERRORS,
             openapi_extra=form("two photos", ("image1", "image2"), image1=PHOTO, image2=PHOTO))
async def face_match(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request)
    comparison = await faces.match(form.file("image1"), form.file("image2"))
    # DeepStack's and CodeProject.AI's similarity is (cosine + 1) / 2, in [0, 1]; the cosine and, where the embedder
    # is calibrated, the confidence (0.5 at its threshold) say more
    body = {"similarity": (comparison.similarity + 1) / 2, "cosine": comparison.similarity}
    if comparison.confidence is not None:
        body["confidence"] = comparison.confidence
    return _answer(body, "match", arrived)


@router.post("/backup", summary="DeepStack's admin backup: the face gallery as one file", response_class=Response,
             responses={**DEEPSTACK_ERRORS, **BACKUP_FILE}, openapi_extra=form("the admin key"))
async def face_backup(request: Request) -> Response:
    faces, _ = await _form(request, admin=True)
    folder = Path(tempfile.mkdtemp(prefix="faces-backup-"))
    target = folder / BACKUP_NAME
    try:
        await faces.backup(target)
    except BaseException:
        _remove(folder)
        raise
    return FileResponse(target, media_type="application/octet-stream", filename=BACKUP_NAME,
                        background=BackgroundTask(_remove, folder))


@router.post("/restore", summary="DeepStack's admin restore: the face gallery replaced by a backup",
             response_model=DeepStackAnswer, responses=DEEPSTACK_ERRORS,
             openapi_extra=form("a backup, and the admin key", ("file",), file=PHOTO))
async def face_restore(request: Request) -> Response:
    arrived = time.perf_counter()
    faces, form = await _form(request, admin=True)
    data = form.file("file")
    folder = Path(tempfile.mkdtemp(prefix="faces-restore-"))
    try:
        source = folder / "restore.db"
        await asyncio.to_thread(source.write_bytes, data)
        summary = await faces.restore(source)
    finally:
        _remove(folder)
    return _answer({"message": f"restored {summary.people} people, {summary.faces} faces"}, "restore", arrived)


def _remove(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink(missing_ok=True)
    folder.rmdir()
