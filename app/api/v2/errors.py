"""Domain errors -> HTTP status for the v2 protocol: each error's own status (app/errors.py), said in
the protocol's terms. Bodies are {"error": "..."}.

The protocol knows 400 (the request), 404 (no such model or version) and 503 (not now); a body or
image over its size limit keeps HTTP's 413, an invoke past its deadline 504, as on /v1. So a model
that cannot load (409 on /v1: files, engine, TPU) is 503 here, the service cannot answer now; a
request /v1 would answer 415 or 422 is 400. Keys (401), 422 from request validation and the server's
own 408/431 come from the app and server as for /v1. Nothing a client sends makes a 500: a bug still
answers with a JSON 500 on an open connection (tritonclient's async client breaks when a server drops
the connection after an unhandled error).
"""

from __future__ import annotations

from app.api.errors import retry_after
from app.errors import ServeError

__all__ = ["retry_after", "status_of"]

# What v2 says where /v1 says something the protocol does not have.
INSTEAD = {409: 503, 415: 400, 422: 400, 500: 503}


def status_of(error: ServeError) -> int:
    return INSTEAD.get(error.status, error.status)
