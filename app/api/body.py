"""The image out of a request: multipart field `image`, or the raw body; size-limited while read."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from app.errors import BodyTooLarge, EmptyBody, RequestError, UnsupportedMediaType

IMAGE_FIELD = "image"
RAW_TYPES = ("application/octet-stream",)

OPENAPI_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "description": f"The image: as multipart field `{IMAGE_FIELD}`, or as the raw body.",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [IMAGE_FIELD],
                    "properties": {IMAGE_FIELD: {"type": "string", "format": "binary"}},
                }
            },
            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def image_bytes(request: Request, limit: int) -> bytes:
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "multipart/form-data":
        data = await _from_multipart(request, await read_limited(request, limit))
    elif not media_type or media_type.startswith("image/") or media_type in RAW_TYPES:
        data = await read_limited(request, limit)
    else:
        raise UnsupportedMediaType(
            f"content type {media_type!r} is not accepted: send the image as multipart field "
            f"'{IMAGE_FIELD}' (curl -F {IMAGE_FIELD}=@photo.jpg) or as the raw body with an image/* or "
            "application/octet-stream content type (curl --data-binary @photo.jpg -H 'Content-Type: image/jpeg')"
        )
    if not data:
        raise EmptyBody("no image: the request body is empty")
    return data


async def _from_multipart(request: Request, body: bytes) -> bytes:
    async def stream():
        yield body

    try:
        form = await MultiPartParser(request.headers, stream(), max_files=4, max_fields=16).parse()
    except MultiPartException as e:
        raise RequestError(f"malformed multipart body: {e.message}") from None
    try:
        field = form.get(IMAGE_FIELD)
        if field is None:
            raise EmptyBody(f"multipart body has no field '{IMAGE_FIELD}' (fields: {sorted(form.keys())})")
        if isinstance(field, UploadFile):
            return await field.read()
        return field.encode("utf-8", "surrogateescape")
    finally:
        await form.close()
