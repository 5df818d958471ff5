"""Domain errors -> HTTP answers for /v1: the status each error class carries (app/errors.py), the body
{"error": "..."}, Retry-After on a refusal to retry.

Logging: a 503 (a full line, a full body budget, a model not ready, devices out) is a refusal the
client is told to retry, and under overload there is one per request; other 5xx (an invoke past its deadline, a
bug) are failures a client can provoke as often. Both go through RefusalLog (app/refusal_log.py), the one place
every door logs its refusals: the first of each kind in full (a failure at ERROR), then one line per window
summing up the rest (every one is still counted in Prometheus, app/metrics.py). 4xx are the client's business
and not logged (a hostile client would fill the log).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import Busy, ServeError
from app.refusal_log import REFUSAL_LOG_WINDOW_S, REFUSED, RefusalLog

log = logging.getLogger(__name__)

refusals = RefusalLog(log)  # one per process, as the log it writes to (its window: the last app installed)


def status_of(error: ServeError) -> int:
    return error.status


def retry_after(error: ServeError) -> dict[str, str] | None:
    """Retry-After, for the refusals that say when to try again (Busy and its kind), in either protocol."""
    return {"Retry-After": str(int(error.retry_after_s))} if isinstance(error, Busy) else None


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def log_answered(request: Request, error: ServeError, status: int) -> None:
    """An error answered with `status`, logged as the module says: a refusal or another 5xx, summed up per kind."""
    if status == REFUSED:
        refusals.refused(request.method, request.scope["path"], error)
    elif status >= 500:
        refusals.failed(request.method, request.scope["path"], error, status)


def log_bug(request: Request, error: Exception) -> None:
    """An exception no handler expected, answered with a 500 in its protocol's shape: its traceback with the
    first of its kind, then summed up (a client that can provoke it once can provoke it per request)."""
    refusals.failed(request.method, request.scope["path"], error, 500, exc_info=True)


async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
    status = status_of(exc)
    log_answered(request, exc, status)
    return error_response(status, str(exc), retry_after(exc))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "path", "body"))
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return error_response(422, "; ".join(parts) or "invalid request")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))


def install(app: FastAPI, refusal_log_window_s: float = REFUSAL_LOG_WINDOW_S) -> None:
    refusals.window_s = refusal_log_window_s
    app.add_exception_handler(ServeError, _serve_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
