"""Domain errors -> HTTP status, in one table. Every error body is {"error": "..."}."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import (
    BackendNotAvailable,
    BadImage,
    BodyTooLarge,
    Busy,
    DeviceHung,
    InvokeTimeout,
    EdgeTpuUnavailable,
    EmptyBody,
    EngineLoadError,
    ImageTooLarge,
    InvalidParameter,
    ModelDirError,
    ModelNotFound,
    NotReady,
    RequestError,
    ServeError,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)

# Most specific first: the first matching class decides.
STATUS: tuple[tuple[type[ServeError], int], ...] = (
    (ModelNotFound, 404),
    (BackendNotAvailable, 400),
    (InvalidParameter, 422),
    (EmptyBody, 400),
    (BadImage, 400),
    (UnsupportedMediaType, 415),
    (BodyTooLarge, 413),
    (ImageTooLarge, 413),
    (RequestError, 400),
    (InvokeTimeout, 504),
    # A device the watchdog took out: Retry-After, as for Busy.
    (DeviceHung, 503),
    (Busy, 503),
    (NotReady, 503),
    # A reload that finds a broken model on disk: the model already loaded keeps serving.
    (ModelDirError, 409),
    (EdgeTpuUnavailable, 409),
    (EngineLoadError, 409),
)


def status_of(error: ServeError) -> int:
    for cls, status in STATUS:
        if isinstance(error, cls):
            return status
    return 500


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
    status = status_of(exc)
    headers = {"Retry-After": str(int(exc.retry_after_s))} if isinstance(exc, Busy) else None
    if status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc)
    return error_response(status, str(exc), headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "path", "body"))
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return error_response(422, "; ".join(parts) or "invalid request")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ServeError, _serve_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
