"""A request's ticket: the one object the registry hands the core (Registry.ticket), the model version the request
holds and its place in line on one of the version's pools.

    async with registry.ticket(name, backend) as ticket:  # the version held; NotReady, BackendNotAvailable at once
        ticket.check_room()                               # before the input is read: Busy (503) if the line is full
        ticket.admit()                                    # once it is here, before any work on it
        result = await ticket.run(tensor)                 # every output tensor

The version stays open while the ticket holds it, whatever reloads swap in meanwhile (app/registry/lifetimes.py
counts the holds); the block's end gives the place back, then the version. A ServeError the request ends with says
which model and backend it was for (`ServeError.target`), so a door can count a refusal under them.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import NamedTuple

import numpy as np

from app.engines import TensorSpec
from app.errors import Busy, ServeError
from app.model_dir.reading import ModelDir
from app.pool import Inputs, Place, RunResult
from app.registry.lifetimes import Lifetimes
from app.registry.versions import ModelVersion
from app.tasks import OutputRoles, Task


class Target(NamedTuple):
    """Where a request goes: the model's name and the backend that serves it."""

    model: str
    backend: str


class Ticket:
    """A request's hold on one model version, and its place in line on one of its pools once admitted."""

    __slots__ = ("version", "backend", "pool", "place", "_holds")

    def __init__(self, version: ModelVersion, backend: str, holds: Lifetimes | None):
        """`holds`: where the version is given back when the ticket closes (None: a ticket that does not hold the
        version itself, the next input of a batch)."""
        self.version = version
        self.backend = backend  # after a run: the backend that ran it
        self.pool = version.pool(backend)
        self.place: Place | None = None
        self._holds = holds

    # -- the model ---------------------------------------------------------------------------------

    @property
    def model(self) -> str:
        return self.version.model_dir.name

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

    @property
    def input(self) -> TensorSpec:
        """The model's one input tensor, the image's (checked at load)."""
        return self.pool.members.inputs[0]

    def input_on(self, backend: str) -> TensorSpec:
        """The model's input tensor on `backend`'s pool of the held version (BackendNotAvailable, saying why)."""
        return self.version.pool(backend).members.inputs[0]

    @property
    def warmup(self) -> dict[str, float | None]:
        """What loading this pool cost: for answers that report it next to their own timings."""
        members = self.pool.members
        return {"load_ms": members.load_ms, "first_inference_ms": members.first_inference_ms}

    # -- the line ----------------------------------------------------------------------------------

    def check_room(self) -> None:
        """Refuse at once (Busy: 503 + Retry-After) when the pool's line is full now, taking nothing: the check
        before a request's input is read."""
        self.pool.check_room()

    def admit(self) -> Place:
        """The place in the pool's line, taken now that the input is here and before any work on it: Busy at once
        if the line filled since the room check. Taken once: again gives the same place."""
        if self.place is None:
            self.place = self.pool.admit()
        return self.place

    async def run(self, tensor: np.ndarray | Future[Inputs]) -> RunResult:
        """The model's one input tensor through one member of the pool, within the line's deadlines (the place taken
        first if it is not yet): every output tensor. The tensor may still be in the making on another thread (a
        `concurrent.futures.Future` of the model's inputs: the core's image step), queued by that thread the moment
        it is made (Place.run). A pool whose every device left hands its line to the version's pool on the backend
        the model falls back to (EnginePool.hand_over): the ticket then says the backend that ran it, and its
        outputs are read with that pool's roles."""
        running = (self.place or self.admit()).run([tensor] if isinstance(tensor, np.ndarray) else tensor)
        del tensor  # a failure to make it is in it too, and this frame joins that error's traceback: no cycle
        result = await running
        ran_on = result.backend
        if ran_on is not None and ran_on != self.backend and ran_on in self.version.pools:
            self.backend, self.pool = ran_on, self.version.pools[ran_on]
        return result

    def overdue(self) -> Busy | None:
        """Busy when the place taken has waited too long to be worth any work on the input (app/pool Place)."""
        return None if self.place is None else self.place.overdue()

    def another(self, backend: str | None = None) -> Ticket:
        """One more place on the same version (the next input of a batch), in the pool of `backend` (default: this
        ticket's), taken now (Busy at once, like admit); valid while this ticket holds the version. Given back by
        its `release()`."""
        ticket = Ticket(self.version, self.backend if backend is None else backend, None)
        ticket.admit()
        return ticket

    def release(self) -> None:
        """The place in line given back (once)."""
        if self.place is not None:
            self.place.release()

    # -- the hold ------------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """The request ended: its place given back, then the version; a ServeError it ended with says whose it was
        (`ServeError.target`)."""
        try:
            self.release()
        finally:
            if self._holds is not None:
                self._holds.let_go(self.version)
            if isinstance(error, ServeError) and error.target is None:
                error.target = Target(self.model, self.backend)

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.close(exc)
