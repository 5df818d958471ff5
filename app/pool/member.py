"""A pool's members, what one run on a member gives back, and the interface the pool and its watchdog
drive every kind of member through.

A member is what the pool hands a request to and what the watchdog watches. Two kinds:
  - `InterpreterMember`: one engine (a whole model), run on the pool's thread of that member;
  - `Pipeline` (app/pool/pipeline.py): a segmented model, one engine per segment, each on its own thread,
    taking `lanes` requests at once.
Both are made of `Stage`s: a loaded engine with what it takes to load it again on the same device. The
watchdog re-creates the stages that hung (`stalled`, `lose`, `renew`), whatever the kind; segment
timings come back in `RunResult.segments_ms`, and a problem in `Member.problem`: typed, never looked
up on an engine.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from app.engines import Engine, EngineOptions, TensorSpec
from app.errors import ServeError


@dataclass(frozen=True)
class Stage:
    """One loaded interpreter: its engine, and the file and options to load it again on its device."""

    engine: Engine
    load_ms: float = 0.0
    device: str | None = None             # the device it is bound to, for health reports
    options: EngineOptions | None = None  # how it was loaded, so the watchdog can load it again
    path: Path | None = None
    index: int = 0                        # its place in a pipeline (segment index); 0 for a whole model


@dataclass(frozen=True)
class RunResult:
    outputs: list[np.ndarray]  # every output tensor, in the model's (the last segment's) order
    inference_ms: float
    cold: bool
    queue_ms: float = 0.0  # from the request's queueing to an interpreter taking it
    segments_ms: list[float] | None = None  # a pipeline: each segment's invoke, in order
    backend: str | None = None  # the backend of the pool whose member ran it (a pool hands its line over)


class Member(ABC):
    """One unit of a pool: it runs `lanes` requests at once, on `lanes` threads the pool gives it."""

    # After the watchdog took it out: False, its thread ends once its invoke returns, releasing the device
    # for the member that replaces it (renew() gives a new one); True, its threads wait while it is
    # repaired in place (renew() gives itself back, its healthy stages still loaded).
    repaired_in_place: ClassVar[bool] = False
    # True: its invoke runs on the lane's own thread (the lane moves it below the loop's priority while the line is
    # overloaded, app/threads.py); False: on threads of the member's own, the lane only waits for them.
    invokes_on_lane: ClassVar[bool] = True

    def __init__(self, stages: Sequence[Stage], lanes: int = 1):
        self.stages = list(stages)
        self.lanes = lanes
        self.healthy = True
        self.problem: str | None = None  # why it is unhealthy
        # Out because a device of it left (unplugged), not because it hung: it comes back re-created when the
        # device is listed again (or a new device takes its place); the watchdog re-creates only hung ones.
        self.departed = False
        self.first_inference_ms: float | None = None
        self.threads: list[threading.Thread] = []  # the pool's, one per lane
        self.live_lanes = 0  # of those threads, the ones still running (the pool counts them)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.stages[0].engine.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.stages[-1].engine.outputs

    @property
    def engine(self) -> Engine | None:
        """The engine of a whole model (plug-ins analyse its graph); None for a pipeline."""
        return self.stages[0].engine if len(self.stages) == 1 else None

    @property
    def device(self) -> str | None:
        return ",".join(s.device for s in self.stages if s.device) or None

    @property
    def options(self) -> EngineOptions | None:
        return self.stages[0].options

    @property
    def load_ms(self) -> float:
        return sum(s.load_ms for s in self.stages)

    @property
    def warm(self) -> bool:
        return self.first_inference_ms is not None

    @property
    def where(self) -> str:
        """How messages name it: its device, else its kind."""
        return self.device or "interpreter"

    @abstractmethod
    def invoke(self, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[float] | None]:
        """Every input tensor -> every output tensor, and each segment's invoke ms (None: one engine)."""

    @abstractmethod
    def stalled(self, now: float, limit_s: float) -> list[Stage]:
        """The stages whose invoke under way has lasted `limit_s` or more at `now` (the pool's clock)."""

    def describe(self, stages: Sequence[Stage]) -> str:
        """What a problem says about these stages, before what happened to them."""
        return ""

    def lose(self, stages: Sequence[Stage], error: ServeError) -> None:
        """The watchdog took these stages out: fail whatever requests are inside the member with `error`."""

    @abstractmethod
    def renew(self, load: Callable[[Stage], Stage]) -> Member:
        """A member to serve again: the stages lost, loaded again with `load` (on the same devices)."""

    @abstractmethod
    def close(self) -> None:
        """Release the engines (called by its last pool thread as it ends)."""


class InterpreterMember(Member):
    """A whole model on one engine, run on the pool's thread."""

    def __init__(self, stage: Stage):
        super().__init__([stage])
        self._engine = stage.engine

    def invoke(self, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], None]:
        return self._engine.run(inputs), None

    def stalled(self, now: float, limit_s: float) -> list[Stage]:
        # the pool asks once its one request has outlived the limit: that request's invoke is the stall
        return list(self.stages)

    def renew(self, load: Callable[[Stage], Stage]) -> InterpreterMember:
        return InterpreterMember(load(self.stages[0]))

    def close(self) -> None:
        self.stages[0].engine.close()


class Members(list[Member]):
    """A pool's members, changed by the pool only (under its lock), and what they load: every member loads the
    same model files, so the first one's tensors are the model's."""

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's input tensors."""
        return self[0].inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self[0].outputs

    @property
    def engine(self) -> Engine | None:
        """A whole model's engine, for plug-ins that analyse its graph; None for a pipeline."""
        return self[0].engine

    @property
    def interpreters(self) -> int:
        """Interpreters loaded: one per member, one per segment of a pipeline."""
        return sum(len(m.stages) for m in self)

    @property
    def lanes(self) -> int:
        """Every member's lanes, healthy or not."""
        return sum(m.lanes for m in self)

    def healthy_lanes(self) -> int:
        """The healthy members' lanes (a loop, not a generator: twice per request)."""
        healthy = 0
        for member in self:
            if member.healthy:
                healthy += member.lanes
        return healthy

    @property
    def load_ms(self) -> float:
        return sum(m.load_ms for m in self)

    @property
    def first_inference_ms(self) -> float | None:
        """The first inference the pool ran (the warm-up, or the first request after a reload)."""
        return self[0].first_inference_ms

    @property
    def warm(self) -> bool:
        return all(m.warm for m in self)

    @property
    def unhealthy(self) -> list[Member]:
        return [m for m in self if not m.healthy]

    @property
    def departed(self) -> bool:
        """Every member is out because its device left: nothing can serve until one is back."""
        return all(m.departed and not m.healthy for m in self)

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the healthy members' lanes ended (their pool closed); False if some have not yet."""
        deadline = time.monotonic() + timeout_s
        for member in list(self):
            if member.healthy:
                for thread in member.threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
        return not any(m.healthy and any(t.is_alive() for t in m.threads) for m in self)


def timed_run(member: Member, inputs: Sequence[np.ndarray], clock: Callable[[], float],
              queue_ms: float = 0.0, backend: str | None = None) -> RunResult:
    """One run, timed by `clock` (seconds); the member's first one is its cold start."""
    cold = not member.warm
    start = clock()
    outputs, segments_ms = member.invoke(inputs)
    elapsed = (clock() - start) * 1000
    if cold:
        member.first_inference_ms = elapsed
    return RunResult(outputs, elapsed, cold, queue_ms, segments_ms, backend)

