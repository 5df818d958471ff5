"""API keys: an inference level and an admin level, as dependencies any router can carry.

    app.include_router(router, dependencies=[InferenceKey])   # models, devices, /v2 metadata ...
    @router.post("/{name}/reload", dependencies=[AdminKey])     # reload, load, unload
    class NativeRoute(DoorRoute): checks = (check_inference_key,)    # a front door's route class

The front doors' routes (/v1 classify, detect, ..., /v2 infer) run in front of FastAPI's router (app/api/routes.py):
no dependency solving per request, so their route classes run check_inference_key first themselves, with the same
answers.

A key is sent as `Authorization: Bearer <key>` or `X-API-Key: <key>`. Inference endpoints
are open until inference keys are set; an admin key is also an inference key. Admin
endpoints need an admin key; with none set they are open only while the service listens
on a loopback address, and answer 403 on any other (secure by default).
Keys are compared with hmac.compare_digest against every configured key, so the time
taken says nothing about which key, or how much of one, matched.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from app.api.deps import door_of

REALM = "edgetpu-serve"
CHALLENGE = {"WWW-Authenticate": f'Bearer realm="{REALM}"'}
HOW_TO_ENABLE_ADMIN = (
    "admin endpoints are disabled: the service listens on {host!r}, not a loopback address, and no admin "
    "key is set; set EDGETPU_SERVE_ADMIN_KEYS (or EDGETPU_SERVE_ADMIN_KEYS_FILE) and send the key as "
    "'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
)


def presented_key(request: Request) -> bytes | None:
    authorization = request.headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip().encode("latin-1")
    key = request.headers.get("x-api-key")
    return key.strip().encode("latin-1") if key else None


def matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
    """Constant time over all keys: every comparison runs, whatever matched."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers=CHALLENGE)


def check_inference_key(request: Request) -> None:
    """401 (HTTPException with the Bearer challenge) unless the request carries an inference or
    admin key; nothing to check while no inference key is set."""
    keys = door_of(request).keys
    if not keys.inference:
        return
    given = presented_key(request)
    if given is None:
        raise _unauthorized("an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
    if not (matches(given, keys.inference) | matches(given, keys.admin)):
        raise _unauthorized("the API key is not valid")


def inference_key_in_head(request: Request) -> bool:
    """For routes whose clients may send the key in the body instead (DeepStack's form field `api_key`): True
    when no key is needed or the head carries a valid one, False when it carries none (the body must), and a 401
    for a key that is not valid."""
    keys = door_of(request).keys
    if not keys.inference or presented_key(request) is None:
        return not keys.inference
    check_inference_key(request)
    return True


def check_inference_key_value(request: Request, value: str | None, missing: str) -> None:
    """A key sent in the body (inference_key_in_head was False): 401 with `missing` unless it is valid."""
    keys = door_of(request).keys
    given = value.strip().encode("utf-8", "surrogateescape") if value else b""
    if not given or not (matches(given, keys.inference) | matches(given, keys.admin)):
        raise _unauthorized(missing)


async def require_inference_key(request: Request) -> None:
    check_inference_key(request)


async def require_admin_key(request: Request) -> None:
    keys = door_of(request).keys
    if not keys.admin:
        if keys.admin_open:
            return
        raise HTTPException(403, HOW_TO_ENABLE_ADMIN.format(host=door_of(request).settings.host))
    given = presented_key(request)
    if given is None:
        raise _unauthorized("an admin key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
    if not matches(given, keys.admin):
        if matches(given, keys.inference):
            raise HTTPException(403, "this API key is not an admin key")
        raise _unauthorized("the admin key is not valid")


InferenceKey = Depends(require_inference_key)
AdminKey = Depends(require_admin_key)
