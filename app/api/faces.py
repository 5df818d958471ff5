"""The face gallery's native REST routes, beside DeepStack's (app/api/deepstack_faces.py), onto the same core
commands (app/core/faces.py):

    GET    /v1/faces            -> the people (userid, faces, when first registered, covered by the embedder served),
                                   the embedder served and every embedder the gallery holds vectors of
    PUT    /v1/faces/{userid}   multipart images (image, image1, ...): the largest face of each registered;
                                ?replace=true (default: a PUT replaces): their earlier faces go;
                                ?replace=false: these are added to theirs
    DELETE /v1/faces/{userid}   the person, their faces and vectors, erased

Keys in a header, as on every native route (the inference key; the admin key for PUT and DELETE with
FACE_EDITS_NEED_ADMIN). Errors {"error": "..."} with the gallery's statuses (docs/faces.md): 400 no face or an
invalid userid, 404 a userid not registered, 409 too many faces, 503 while the face models are not set or served.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.auth import check_admin_key_value
from app.api.deps import door_of
from app.api.face_forms import read_face_form
from app.api.face_schemas import NATIVE_ERRORS, PHOTO, DeletedOut, PeopleOut, RegisteredOut, form
from app.errors import RequestError

router = APIRouter(prefix="/v1/faces", tags=["faces"])


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat(timespec="seconds")


@router.get("", summary="The registered people, and which embedders' vectors cover them", response_model=PeopleOut,
            responses=NATIVE_ERRORS)
async def list_people(request: Request) -> dict:
    faces = door_of(request).service.faces
    people = await faces.people()
    served = await faces.embedder_sha256()
    embedders = await faces.store.on_gallery("embedders")
    return {
        "count": len(people),
        "faces": sum(person.faces for person in people),
        "embedder": served,
        "people": [{"userid": p.userid, "faces": p.faces, "registered": _iso(p.created),
                    "covered": p.embedded.get(served, 0) == p.faces} for p in people],
        "embedders": [{"sha256": e.sha256, "dimension": e.dimension, "vectors": e.vectors, "served": e.sha256 == served}
                      for e in embedders],
    }


@router.put("/{userid}", summary="Register a person's faces (the largest face of each image)",
            response_model=RegisteredOut, responses=NATIVE_ERRORS, openapi_extra=form(
                "the person's photos: every file of the form (image, image1, ...)", ("image",), image=PHOTO))
async def put_person(request: Request, userid: str, replace: Annotated[bool, Query(
        description="true: the person's earlier faces are replaced; false: added to (a face they hold already: "
                    "not twice)")] = True
                     ) -> dict:
    door = door_of(request)
    if door.settings.face_edits_need_admin:
        check_admin_key_value(request)
    door.service.faces.models.pair()  # while the face models are not set: the 503 with the fix, before the body
    form = await read_face_form(request, door.settings.max_body_bytes)
    images = form.images()
    if not images:
        raise RequestError("no image: send the photos as multipart files (image, image1, ...)")
    enrolment = await door.service.faces.register(userid, images, replace=replace)
    done = enrolment.registration
    return {"userid": done.userid, "created": done.created, "added": done.added, "replaced": done.replaced,
            "faces": done.faces, "several_faces": [i for i in enrolment.crowded]}


@router.delete("/{userid}", summary="Delete a person, their faces and vectors", response_model=DeletedOut,
               responses=NATIVE_ERRORS)
async def delete_person(request: Request, userid: str) -> dict:
    door = door_of(request)
    if door.settings.face_edits_need_admin:
        check_admin_key_value(request)
    deletion = await door.service.faces.delete(userid)
    return {"userid": deletion.userid, "faces": deletion.faces, "erased": deletion.erased}
