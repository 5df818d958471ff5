"""The service's API keys as the settings give them: an inference level and an admin level (app/api/auth.py checks
them). Read once, when the HTTP app is made; a key that cannot be one stops the start."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from app.errors import ServeError
from app.settings import Settings


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
