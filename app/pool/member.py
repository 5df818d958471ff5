"""One interpreter of a pool, and what one run on it gives back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.engines import Engine, EngineOptions


@dataclass
class Member:
    engine: Engine
    load_ms: float
    first_inference_ms: float | None = None
    device: str | None = None      # the device this interpreter is bound to, for health reports
    healthy: bool = True
    problem: str | None = None     # why it is unhealthy
    options: EngineOptions | None = None  # how it was loaded, so the watchdog can load it again
    thread: threading.Thread | None = field(default=None, repr=False, compare=False)

    @property
    def warm(self) -> bool:
        return self.first_inference_ms is not None


@dataclass(frozen=True)
class RunResult:
    output: np.ndarray
    inference_ms: float
    cold: bool
    queue_ms: float = 0.0  # from the request's queueing to an interpreter taking it
    segments_ms: list[float] | None = None  # a pipelined model: each segment's invoke (app/pipeline.py)


def timed_run(member: Member, x: np.ndarray, clock: Callable[[], float], queue_ms: float = 0.0) -> RunResult:
    """One invoke, timed by `clock` (seconds); the member's first one is its cold start."""
    cold = not member.warm
    start = clock()
    output = member.engine.run(x)
    elapsed = (clock() - start) * 1000
    if cold:
        member.first_inference_ms = elapsed
    return RunResult(output, elapsed, cold, queue_ms, getattr(member.engine, "last_segments_ms", None))
