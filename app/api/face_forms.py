"""The form of a face request, as DeepStack's clients send it: multipart with files (`image`, `image1`, ...,
DeepStack's register takes every file of the form) and text fields (`userid`, `api_key`, `admin_key`,
`min_confidence`), or url-encoded text fields alone (deepstack-python's list sends `api_key` so), or no body at
all. Read whole within the body limit and counted against the memory budget (app/api/body.py read_limited)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

from app.api.body import read_limited
from app.errors import RequestError

FILES_MAX = 101  # a registration's images (a person has at most 100 faces), and one more to say so
FIELDS_MAX = 32


@dataclass
class FaceForm:
    """The text fields by name, and the files in the form's order, by field name."""

    fields: dict[str, str] = field(default_factory=dict)
    files: list[tuple[str, bytes]] = field(default_factory=list)

    def text(self, name: str) -> str | None:
        return self.fields.get(name)

    def file(self, name: str) -> bytes:
        """The file sent as `name`; DeepStack's 400 "No valid image file found" in effect when there is none."""
        for key, data in self.files:
            if key == name:
                return data
        raise RequestError(f"No valid image file found: send the photo as the multipart file field '{name}'")

    def images(self) -> list[bytes]:
        return [data for _, data in self.files]


async def read_face_form(request: Request, limit: int) -> FaceForm:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    body = bytes(await read_limited(request, limit, copies=2))
    if not body:
        return FaceForm()
    if media_type == "multipart/form-data":
        parser = MultiPartParser(request.headers, _once(body), max_files=FILES_MAX, max_fields=FIELDS_MAX)
    elif media_type == "application/x-www-form-urlencoded":
        parser = FormParser(request.headers, _once(body))
    else:
        raise RequestError(f"content type {media_type or 'none'!r}: send a multipart form (files 'image', 'image1', "
                           "..., and text fields such as 'userid' and 'api_key'), as DeepStack's clients do")
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise RequestError(f"malformed multipart body: {e.message}") from None
    found = FaceForm()
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                await value.seek(0)
                data = await value.read()
                if data:
                    found.files.append((name, data))
            else:
                found.fields.setdefault(name, value)
    finally:
        await form.close()
    return found


async def _once(body: bytes):
    yield body
