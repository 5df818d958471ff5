"""What clients see of a model's state: loading, ready, degraded, unhealthy or failed, why, and since when."""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.registry.versions import ModelVersion


@dataclass
class ModelStatus:
    state: str  # loading | ready | degraded | unhealthy | failed
    error: str | None = None
    since: float | None = None  # when this state began (unix time)


SERVING = ("ready", "degraded")


def current_status(stored: ModelStatus, version: ModelVersion | None) -> ModelStatus:
    """The stored state, and what happened since: a fallback, devices the watchdog took out."""
    if stored.state not in SERVING or version is None:
        return stored
    state, notes = stored.state, [stored.error] if stored.error else []
    for key, fallback in version.fallbacks.items():
        notes.append(f"{key} requested, serving on {fallback.backend}: {fallback.reason}")
        state = "degraded"
    for backend, pool in version.pools.items():
        sick = pool.unhealthy  # interpreters, or pipelines with a segment lost: every kind of member alike
        if sick:
            notes.append(f"{backend}: " + "; ".join(f"{m.where} {m.problem}" for m in sick))
            if len(sick) == len(pool.members):
                state = "unhealthy"
    return ModelStatus(state, "; ".join(notes) or None, stored.since)


def iso_time(unix: float | None) -> str | None:
    """UTC, to the second, for clients: when a state began, when a version loaded."""
    return None if unix is None else iso(unix)


def iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))
