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
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from app.errors import ServeError
from app.settings import Settings

REALM = "edgetpu-serve"
CHALLENGE = {"WWW-Authenticate": f'Bearer realm="{REALM}"'}
HOW_TO_ENABLE_ADMIN = (
    "admin endpoints are disabled: the service listens on {host!r}, not a loopback address, and no admin "
    "key is set; set EDGETPU_SERVE_ADMIN_KEYS (or EDGETPU_SERVE_ADMIN_KEYS_FILE) and send the key as "
    "'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
)


def read_key_file(path: Path) -> list[str]:
    """One key per line (Docker/Kubernetes secrets); blank lines and '#' comments skipped."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise ServeError(f"cannot read API keys from {path}: {e}") from None
    keys = [line.strip() for line in text.splitlines()]
    return [k for k in keys if k and not k.startswith("#")]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or "0.0.0.0"-like wildcard: reachable from elsewhere


@dataclass(frozen=True)
class ApiKeys:
    inference: tuple[bytes, ...]
    admin: tuple[bytes, ...]
    admin_open: bool  # no admin key, loopback only

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        inference = list(settings.api_keys)
        admin = list(settings.admin_keys)
        if settings.api_keys_file is not None:
            inference += read_key_file(settings.api_keys_file)
        if settings.admin_keys_file is not None:
            admin += read_key_file(settings.admin_keys_file)
        for key in inference + admin:
            if not key.isascii() or not key.isprintable() or " " in key:
                raise ServeError("an API key must be printable ASCII without spaces")
        return cls(inference=tuple(k.encode() for k in inference), admin=tuple(k.encode() for k in admin),
                   admin_open=not admin and is_loopback(settings.host))


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
    keys: ApiKeys = request.app.state.api_keys
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
    keys: ApiKeys = request.app.state.api_keys
    if not keys.inference or presented_key(request) is None:
        return not keys.inference
    check_inference_key(request)
    return True


def check_inference_key_value(request: Request, value: str | None, missing: str) -> None:
    """A key sent in the body (inference_key_in_head was False): 401 with `missing` unless it is valid."""
    keys: ApiKeys = request.app.state.api_keys
    given = value.strip().encode("utf-8", "surrogateescape") if value else b""
    if not given or not (matches(given, keys.inference) | matches(given, keys.admin)):
        raise _unauthorized(missing)


async def require_inference_key(request: Request) -> None:
    check_inference_key(request)


async def require_admin_key(request: Request) -> None:
    keys: ApiKeys = request.app.state.api_keys
    if not keys.admin:
        if keys.admin_open:
            return
        raise HTTPException(403, HOW_TO_ENABLE_ADMIN.format(host=request.app.state.settings.host))
    given = presented_key(request)
    if given is None:
        raise _unauthorized("an admin key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
    if not matches(given, keys.admin):
        if matches(given, keys.inference):
            raise HTTPException(403, "this API key is not an admin key")
        raise _unauthorized("the admin key is not valid")


InferenceKey = Depends(require_inference_key)
AdminKey = Depends(require_admin_key)
