"""What clients see of a model's state: loading, ready, degraded, unhealthy or failed, why, and since when.

A model is degraded, and still serving, where a backend does not serve it (another does instead, or none:
one line per backend, saying why), a reload failed (the version before serves on), or some of its devices
are out or in trouble. Clients see file names relative to the model directory; full paths go to the log only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.registry.versions import ModelVersion


@dataclass
class ModelStatus:
    state: str  # loading | ready | degraded | unhealthy | failed
    error: str | None = None
    since: float | None = None  # when this state began (unix time)


SERVING = ("ready", "degraded")


def current_status(stored: ModelStatus, version: ModelVersion | None,
                   device_problems: Mapping[str, Mapping[str, str]] | None = None) -> ModelStatus:
    """The stored state, and what happened since: a fallback, devices the watchdog took out, devices
    in trouble that still serve (device_problems: backend -> device -> what is wrong, from the plug-ins)."""
    if stored.state not in SERVING or version is None:
        return stored
    state, notes = stored.state, [one_line(stored.error)] if stored.error else []
    serving = f"; served on {', '.join(version.pools)}" if version.pools else ""  # the backends that can serve it
    for key, fallback in version.fallbacks.items():
        notes.append(f"{key}: not served: {fallback.reason.rstrip('.') if serving else fallback.reason}{serving}"
                     if fallback.backend is None
                     else f"{key} requested, serving on {fallback.backend}: {fallback.reason}")
        state = "degraded"
    for backend, pool in version.pools.items():
        sick = pool.members.unhealthy  # interpreters, or pipelines with a segment lost: every kind of member alike
        if sick:  # hung and being re-created, or a device gone (unplugged): fewer serve, or none
            notes.append(f"{backend}: " + "; ".join(f"{m.where} {m.problem}" for m in sick))
            everyone = len(sick) == len(pool.members)
            if everyone and pool.handed_to:  # its requests go to the backend the model moves to
                notes.append(f"{backend} requested, serving on {pool.handed_to}")
            state = ("unhealthy" if everyone and not pool.handed_to else
                     "degraded" if state == "ready" else state)
        troubled = (device_problems or {}).get(backend, {})
        for device in dict.fromkeys(s.device for m in pool.members for s in m.stages if s.device in troubled):
            notes.append(f"{backend}: {troubled[device]}")
            state = "degraded" if state == "ready" else state
    return ModelStatus(state, "; ".join(notes) or None, stored.since)


def one_line(text: str) -> str:
    """A reason as one line of a status: the lines of a multi-line message (a runtime's own account of a
    failure, say) joined, runs of white space made one space."""
    return " ".join(text.split())


def public_text(text: str, model_dir: Path) -> str:
    """File names relative to the model directory: clients never see the host's paths."""
    for root in {str(model_dir.resolve()), str(model_dir)}:
        text = text.replace(root.rstrip(os.sep) + os.sep, "")
    return text


def iso_time(unix: float | None) -> str | None:
    """UTC, to the second, for clients: when a state began, when a version loaded."""
    return None if unix is None else iso(unix)


def iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))
