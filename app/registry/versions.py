"""A model version, the unit of lifetime.

A load or reload builds a complete ModelVersion: its task, its pools per backend, the task's output roles per
backend (resolved once, by tensor name), the fallbacks in force. A request holds the version current when it
started until it is answered (its ticket: app/registry/tickets.py), so it never meets a closed interpreter; a
replaced version is retired and closed when the last request holding it ends (app/registry/lifetimes.py counts
them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.engines import Fallback
from app.errors import BackendNotAvailable
from app.model_dir.reading import ModelDir
from app.pool import EnginePool
from app.tasks import OutputRoles, Task


@dataclass(eq=False)
class ModelVersion:
    """One load of a model directory: its pools per backend, alive while a request holds it."""

    model_dir: ModelDir
    task: Task
    pools: dict[str, EnginePool]
    roles: dict[str, OutputRoles]   # per backend: the task's roles -> that pool's output tensors
    fallbacks: dict[str, Fallback]  # requested backend -> the one serving it instead, and why
    number: int                     # 1 for the first load, +1 per reload
    loaded_at: float = field(default_factory=time.time)
    holders: int = 0                # requests holding it now (their tickets)
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
