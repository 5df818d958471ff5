"""A model version, the unit of lifetime, and a request's lease on one.

A load or reload builds a complete ModelVersion: its task, its pools per backend, the task's
output roles per backend (resolved once, by tensor name), the fallbacks in force. A request holds the version current when it started until it is
answered, so it never meets a closed interpreter; a replaced version is retired and closed
when its last lease ends (app/registry/registry.py counts the leases).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from app.engines import Fallback, TensorSpec
from app.errors import BackendNotAvailable, RequestError
from app.model_dir.reading import ModelDir
from app.pool import EnginePool, Place, RunResult
from app.tasks import OutputRoles, Task

T = TypeVar("T")

@dataclass(eq=False)
class ModelVersion:
    """One load of a model directory: its pools per backend, alive while a lease holds it."""

    model_dir: ModelDir
    task: Task
    pools: dict[str, EnginePool]
    roles: dict[str, OutputRoles]   # per backend: the task's roles -> that pool's output tensors
    fallbacks: dict[str, Fallback]  # requested backend -> the one serving it instead, and why
    number: int                     # 1 for the first load, +1 per reload
    loaded_at: float = field(default_factory=time.time)
    leases: int = 0
    retired: bool = False

    @property
    def name(self) -> str:
        return self.model_dir.name

    @property
    def fallback(self) -> str | None:
        """Why a requested backend is served by another, if one is."""
        return "; ".join(f.reason for f in self.fallbacks.values()) or None

    def pool(self, backend: str) -> EnginePool:
        try:
            return self.pools[backend]
        except KeyError:
            fallback = self.fallbacks.get(backend)
            if fallback and fallback.backend is None:
                ask = f"; ask with backend={next(iter(self.pools))}" if self.pools else ""  # one that serves it
                raise BackendNotAvailable(f"model {self.name!r} cannot be served on {backend!r}: {fallback.reason}"
                                          f"{ask}") from None
            if fallback:
                raise BackendNotAvailable(
                    f"model {self.name!r} is served on {fallback.backend!r} instead of {backend!r}: "
                    f"{fallback.reason}; ask with backend={fallback.backend}") from None
            raise BackendNotAvailable(
                f"backend {backend!r} is not loaded for model {self.name!r}; loaded: {sorted(self.pools)}"
            ) from None

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()



@dataclass
class Lease:
    """A request's hold on one model version, and its place in one of its pools once admitted."""

    version: ModelVersion
    backend: str
    pool: EnginePool
    place: Place | None = None

    @property
    def model_dir(self) -> ModelDir:
        return self.version.model_dir

    @property
    def task(self) -> Task:
        return self.version.task

    @property
    def roles(self) -> OutputRoles:
        """The task's output roles on this pool: where each role's tensor is among a run's outputs."""
        return self.version.roles[self.backend]

    def roles_for(self, task: Task) -> OutputRoles:
        """The roles of `task` on this pool, or a RequestError when the leased model is of another task
        (a route of one task asked for a model of another)."""
        if self.version.task is not task:
            raise RequestError(f"model {self.model_dir.name!r} has task {self.version.task.name!r}; this route "
                               f"answers {task.name} models only")
        return self.roles

    @property
    def input(self) -> TensorSpec:
        """The model's one input tensor, the image's (checked at load)."""
        return self.pool.inputs[0]

    @property
    def warmup(self) -> dict[str, float | None]:
        """What loading this pool cost: for answers that report it next to their own timings."""
        return {"load_ms": self.pool.load_ms, "first_inference_ms": self.pool.first_inference_ms}

    def check_room(self) -> None:
        """Refuse at once (Busy: 503 + Retry-After) when the pool's line is full now, taking nothing: the check
        before a request's input is read."""
        self.pool.check_room()

    def admit(self) -> None:
        """Take a place in the pool's line, now that the input is here and before any work on it:
        Busy at once if the line filled since the room check. Once per lease; again is a no-op."""
        if self.place is None:
            self.place = self.pool.admit()

    def release(self) -> None:
        if self.place is not None:
            self.place.release()

    async def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        """Every input tensor through one member of the pool, within the pool's deadlines: every output."""
        self.admit()  # a no-op when taken already (a batch takes all its places first)
        return self._ran_on(await self.place.run(inputs))

    async def run_after(self, prepare: Callable[[], tuple[Sequence[np.ndarray], T]],
                        executor: Executor) -> tuple[RunResult, T]:
        """`prepare()` on an `executor` thread gives the input tensors (and what else it made), which go from
        there straight through a member; the place in line is taken first, before `prepare()` does any work.
        The run's result, and what else `prepare()` made (Place.run_after)."""
        self.admit()
        result, made = await self.place.run_after(prepare, executor)
        return self._ran_on(result), made

    def _ran_on(self, result: RunResult) -> RunResult:
        """A pool whose every device left hands its line to the version's pool on the backend the model falls
        back to (EnginePool.hand_over): the answer then says the backend that ran it, and its outputs are read
        with that pool's roles."""
        if result.backend is not None and result.backend != self.backend and result.backend in self.version.pools:
            self.backend, self.pool = result.backend, self.version.pools[result.backend]
        return result

    @contextmanager
    def another(self, backend: str | None = None) -> Iterator[Lease]:
        """One more admitted place on the same version (the next input of a batch), in the pool
        of `backend` (default: this lease's). Refuses at once like admit(); only valid while
        this lease is held, which keeps the version alive."""
        key = self.backend if backend is None else backend
        lease = Lease(self.version, key, self.version.pool(key))
        lease.admit()
        try:
            yield lease
        finally:
            lease.release()
