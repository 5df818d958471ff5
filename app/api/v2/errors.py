"""Domain errors -> HTTP status for the v2 protocol, in one table. Bodies are {"error": "..."}.

The protocol knows 400 (the request), 404 (no such model or version) and 503 (not now);
a body or image over its size limit keeps HTTP's 413, an invoke past its deadline 504, as on
/v1. Keys (401), 422 and the server's own 408/431 come from the app and server as for /v1. Nothing a client sends makes a 500: a bug
still answers with a JSON 500 on an open connection (tritonclient's async client breaks when
a server drops the connection after an unhandled error).
"""

from __future__ import annotations

from app.errors import (
    BackendNotAvailable,
    BodyTooLarge,
    Busy,
    ImageTooLarge,
    InvokeTimeout,
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
    (ImageTooLarge, 413),
    (RequestError, 400),  # and a damaged or undecodable image (BadImage)
    (InvokeTimeout, 504),  # with Retry-After, as every Busy
    (Busy, 503),      # and DeviceHung, and a full body budget: Retry-After
    (NotReady, 503),  # and ShuttingDown
    (ServeError, 503),  # a model that cannot load (files, engine, TPU): the service cannot answer now
)


def status_of(error: ServeError) -> int:
    return next(status for cls, status in STATUS if isinstance(error, cls))


def retry_after(error: ServeError) -> dict[str, str] | None:
    return {"Retry-After": str(int(error.retry_after_s))} if isinstance(error, Busy) else None
