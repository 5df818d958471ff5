"""The image out of a request: multipart field `image`, or the raw body; size-limited while read,
and counted against the memory budget for bodies in flight (app/memory.py) while held. The body, and the image
taken out of a multipart one, are the request's own buffers (Reservation.own): their memory ends with the request."""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from app.api.deps import door_of
from app.errors import BodyTooLarge, ClientGone, EmptyBody, RequestError, UnsupportedMediaType
from app.memory import ByteBudget, Reservation

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


BUDGET_SCOPE_KEY = "edgetpu_serve.body_reservation"


class HoldBodyBudget:
    """ASGI middleware: each HTTP request gets a Reservation of the app's body budget,
    released when the request ends (response sent, error, or client gone)."""

    def __init__(self, app, budget: ByteBudget):
        self.app = app
        self.budget = budget

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        reservation = scope[BUDGET_SCOPE_KEY] = Reservation(self.budget)
        try:
            await self.app(scope, receive, send)
        finally:
            reservation.release()


async def _reserve(request: Request, size: int) -> Reservation | None:
    reservation = request.scope.get(BUDGET_SCOPE_KEY)
    if reservation is not None:
        await reservation.reserve(size, door_of(request).settings.wait_timeout_s)
    return reservation


async def hold_more(request: Request, size: int) -> Reservation | None:
    """Count `size` more bytes of this request against the body budget (an inflated copy of
    its body, say); held until the request ends, and waited for ahead of requests that hold
    nothing yet. Its Reservation, to shrink once the size is known."""
    return await _reserve(request, size)


async def read_limited(request: Request, limit: int, copies: int = 1, scratch: int = 0) -> bytearray:
    """The body, at most `limit` bytes, counted against the body budget (`copies` times its
    size while read: a multipart body and the file inside it are both held for a moment; and
    `scratch` bytes more that its door works with beside it, reserved together: a second
    reservation would wait while holding the first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    # Chunked (no length): the most it may be is reserved, the unused part given back after.
    expected = int(declared) if declared is not None and declared.isdigit() else limit
    reservation = await _reserve(request, expected * copies + scratch)
    # One growing buffer (glibc grows a large one with mremap, in place), not a list of chunks joined.
    body, size = bytearray(), 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
            body += chunk
    except ClientDisconnect:
        raise ClientGone("the client closed the connection before its body was read") from None
    if reservation is not None:
        reservation.own(body)
        if declared is None:
            reservation.shrink_to(size * copies + scratch)
    return body


async def image_bytes(request: Request, limit: int) -> bytearray:
    return (await image_and_fields(request, limit))[0]


async def image_and_fields(request: Request, limit: int,
                           fields: tuple[str, ...] = ()) -> tuple[bytearray, dict[str, str]]:
    """The image, and the multipart text fields named in `fields` that the body has (none from a raw body)."""
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    found: dict[str, str] = {}
    if media_type == "multipart/form-data":
        data = await _from_multipart(request, await read_limited(request, limit, copies=2), fields, found)
        reservation = request.scope.get(BUDGET_SCOPE_KEY)
        if reservation is not None:
            reservation.own(data)
            reservation.shrink_to(len(data))  # the multipart body itself is gone
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
    return data, found


async def _from_multipart(request: Request, body: bytes, fields: tuple[str, ...] = (),
                          found: dict[str, str] | None = None) -> bytearray:
    async def stream():
        yield body

    try:
        form = await MultiPartParser(request.headers, stream(), max_files=4, max_fields=16).parse()
    except MultiPartException as e:
        raise RequestError(f"malformed multipart body: {e.message}") from None
    try:
        for name in fields:  # text fields beside the image (DeepStack's api_key, min_confidence)
            value = form.get(name)
            if isinstance(value, str):
                found[name] = value
        field = form.get(IMAGE_FIELD)
        if field is None:
            raise EmptyBody(f"multipart body has no field '{IMAGE_FIELD}' (fields: {sorted(form.keys())})")
        if isinstance(field, UploadFile):
            return await _file_bytes(field)
        return bytearray(field.encode("utf-8", "surrogateescape"))
    finally:
        await form.close()


async def _file_bytes(field: UploadFile) -> bytearray:
    """The file part's bytes, read into one buffer of its size (no second copy); from disk, where the parser
    spooled a large one, on a thread, as UploadFile.read does."""
    data = bytearray(field.size or 0)
    await field.seek(0)
    if len(data) <= MultiPartParser.spool_max_size:
        read = field.file.readinto(data)
    else:
        read = await run_in_threadpool(field.file.readinto, data)
    if read != len(data):
        raise RequestError(f"multipart field '{IMAGE_FIELD}': {read} bytes read of {len(data)}")
    return data
