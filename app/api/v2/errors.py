"""Domain errors -> HTTP status for the v2 protocol, in one table. Bodies are {"error": "..."}.

The protocol knows 400 (the request), 404 (no such model or version) and 503 (not now);
a body over the size limit keeps HTTP's 413. Nothing a client sends makes a 500: a bug
still answers with a JSON 500 on an open connection (tritonclient's async client breaks when
a server drops the connection after an unhandled error).
"""

from __future__ import annotations

from app.errors import (
    BackendNotAvailable,
    BodyTooLarge,
    Busy,
    ModelNotFound,
    NotReady,
    RequestError,
    ServeError,
)

# Most specific first: the first matching class decides.
STATUS: tuple[tuple[type[ServeError], int], ...] = (
    (ModelNotFound, 404),
    (BackendNotAvailable, 400),
    (BodyTooLarge, 413),
    (RequestError, 400),
    (Busy, 503),      # and DeviceHung: Retry-After
    (NotReady, 503),
    (ServeError, 503),  # a model that cannot load (files, engine, TPU): the service cannot answer now
)


def status_of(error: ServeError) -> int:
    return next(status for cls, status in STATUS if isinstance(error, cls))


def retry_after(error: ServeError) -> dict[str, str] | None:
    return {"Retry-After": str(int(error.retry_after_s))} if isinstance(error, Busy) else None
