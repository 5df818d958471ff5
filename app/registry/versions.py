"""A model version, the unit of lifetime, and a request's lease on one.

A load or reload builds a complete ModelVersion: its pools per backend, the input quantizers,
the fallbacks in force. A request holds the version current when it started until it is
answered, so it never meets a closed interpreter; a replaced version is retired and closed
when its last lease ends (app/registry/registry.py counts the leases).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from app.engines import Fallback
from app.errors import BackendNotAvailable
from app.imaging import InputQuantizer
from app.model_dir import ModelDir
from app.pool import EnginePool, Place, RunResult


@dataclass(eq=False)
class ModelVersion:
    """One load of a model directory: its pools per backend, alive while a lease holds it."""

    model_dir: ModelDir
    pools: dict[str, EnginePool]
    quantizers: dict[str, InputQuantizer]
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
                raise BackendNotAvailable(f"model {self.name!r} cannot be served on {backend!r}: {fallback.reason}") from None
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


LoadedModel = ModelVersion


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
    def quantizer(self) -> InputQuantizer:
        return self.version.quantizers[self.backend]

    def admit(self) -> None:
        """Take a place in the pool's line, now that the input is here and before any work on it:
        Busy at once if the line filled since the room check. Once per lease; again is a no-op."""
        if self.place is None:
            self.place = self.pool.admit()

    def release(self) -> None:
        if self.place is not None:
            self.place.release()

    async def run(self, tensor) -> RunResult:
        """The input tensor through one interpreter of the pool, within the pool's deadlines."""
        self.admit()  # a no-op when taken already (a batch takes all its places first)
        return await self.place.run(tensor)

    async def run_after(self, prepare: Callable[[], np.ndarray], executor: Executor) -> RunResult:
        """`prepare()` on an `executor` thread, its tensor then straight through an interpreter;
        the place in line is taken first, before `prepare()` does any work."""
        self.admit()
        return await self.place.run_after(prepare, executor)

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
