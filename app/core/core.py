"""The entry of the core: the ticket of a request on the model it goes to (`Core.hold`: the model named, else its
task's default; the registry's one object, the version held and its place in line), and one input through it to the
task's answer (`Core.answer`), or a batch of inputs to the task's named tensors (`Core.tensors`, for tensor
protocols).

A front door calls it the same way whatever its wire format:

    async with core.hold(task, model, backend) as ticket:  # the version, and a 503 at once if the line is full
        given = ...  # read the body: an ImageInput or a TensorInput
        answer = await core.answer(ticket, given, options)  # a place in line, the input, the run, the task's reading

Admission before work: the hold checks the pool's line before the door reads its input, so a full line answers at
once whatever a body is doing; the place in line is taken once the input is here (a slow body holds none), before
any work on it. A door whose HTTP head check already made the room check says so (`room_checked`), and the request is
checked once. Errors are the domain's (app/errors.py); one raised once the model and backend are known carries them
(`ServeError.target`), so a door can count a refusal under the model it was for: the core calls nobody back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.core import runs
from app.core.catalog import ModelDescription, describe
from app.core.images import ImageWork
from app.core.inputs import Given
from app.errors import ModelNotFound, RequestError, ServeError
from app.registry import ModelStatus, ModelVersion, Registry, Target, Ticket
from app.tasks import Answer, Task


@dataclass(frozen=True)
class Tensors:
    """One input of a batch read as its task's named tensors (a tensor protocol's outputs), with its run's stages."""

    values: dict[str, np.ndarray]
    stages_ms: dict[str, float]
    cold: bool


class Core:
    """The request path as a library: give it a task, a model (None: the task's default), a backend (None: the
    default) and an input; get the task's answer. Doors ask it, never the registry, what they tell of the models
    (read-only questions: `models`, `describe`, ...), and the few changes they make are its commands (`add`,
    `reload`)."""

    def __init__(self, registry: Registry, images: ImageWork):
        self.registry = registry
        self.images = images

    # -- the models, as doors see them (read-only) -------------------------------------------------------------

    def models(self, task: str | None = None) -> list[str]:
        """The models served, in served order; of one task (model.json's name: "detection") when given."""
        registry = self.registry
        names = registry.names()
        return names if task is None else [n for n in names if registry.models.model_dir(n).manifest.task == task]

    def default_model(self, task: str) -> str | None:
        """The model a request of `task` that names none goes to, as settled at start; None where it has none."""
        return self.registry.default_for(task)

    def describe(self, name: str, serving: bool = False) -> ModelDescription:
        """The one description of a model (app/core/catalog.py), for every door; ModelNotFound for a name not
        served, and with `serving` NotReady while no version of it serves (loading, failed)."""
        return describe(self.registry, name, serving)

    def labels(self, name: str) -> tuple[str, ...]:
        """The model's labels, by class id (as its model directory was last read)."""
        self.registry.status(name)  # ModelNotFound for a name not served
        return self.registry.models.model_dir(name).labels

    def serving(self, name: str) -> ModelVersion | None:
        """The version of `name` serving now, None while none does: the same object until a reload swaps in
        another, so a door keeps what it made of a model while this is the same (Frigate's door, per request)."""
        return self.registry.serving(name)

    def status(self, name: str) -> ModelStatus:
        """The model's state now (ModelNotFound for a name not served)."""
        return self.registry.status(name)

    def ready(self) -> bool:
        """Every model serving (ready, or degraded but answering on some backend)."""
        return self.registry.ready()

    def backends(self) -> list[str]:
        """The backends a request may name, in configured order; the first is the one a request naming none gets."""
        return self.registry.served_backends()

    def provider(self, backend: str) -> str:
        """The kind of processor `backend` runs models on (CPU, TPU), as CodeProject.AI's `executionProvider`."""
        return self.registry.plugins[backend].execution_provider

    async def settled(self, timeout_s: float) -> bool:
        """Once the models configured at start have loaded (or failed), at most timeout_s: whether they have."""
        return self.registry.wait_loaded(0) or await asyncio.to_thread(self.registry.wait_loaded, timeout_s)

    # -- what doors may change (commands) ----------------------------------------------------------------------

    def add(self, path: Path) -> None:
        """Serve a model directory written while serving (a client's upload): loaded and warmed up, then served
        under its name; never replaces one (app/registry/registry.py `Registry.add`). Blocking: off the loop."""
        self.registry.add(path)

    async def reload(self, name: str) -> None:
        """Load `name` again from disk in this process and swap it in (the version serving keeps serving where the
        load fails: the error says why)."""
        await asyncio.to_thread(self.registry.reload, name)

    # -- requests ----------------------------------------------------------------------------------------------

    def model_of(self, task: Task | None, model: str | None) -> str:
        """The model a request names, else its task's default (settled at start); ModelNotFound when none."""
        if model is not None:
            return model
        default = self.registry.default_for(task.name) if task is not None else None
        if default is None:
            what = f"no {task.name} model is served, so a request that names no model" if task is not None else \
                "a request that names no model"
            raise ModelNotFound(f"{what} has none to go to; serving {self.registry.names()}")
        return default

    def check_room(self, task: Task | None, model: str | None, backend: str | None) -> Target | None:
        """The room check of a request not yet read (an HTTP head): Busy (503, Retry-After) when the line of its
        pool is full now; its target when there is room; None where it cannot be placed (its door answers it as
        usual, checking the room itself)."""
        try:
            name = self.model_of(task, model)
        except ServeError:
            return None
        found = self.registry.pool_for(name, backend)
        if found is None:
            return None
        key, pool = found
        target = Target(name, key)
        try:
            pool.check_room()
        except ServeError as e:
            e.target = target
            raise
        return target

    def hold(self, task: Task | None, model: str | None, backend: str | None = None, *,
             room_checked: bool = False) -> Ticket:
        """`async with core.hold(...) as ticket`: the model's current version held until the block ends (a reload
        meanwhile never closes it under the request), on its pool for `backend`, with its room check unless the
        request had it (`room_checked`); `task` None: a model of any task (a tensor protocol reads the task's named
        tensors). A ServeError raised once the version is held carries its target (`ServeError.target`)."""
        ticket = self.registry.ticket(self.model_of(task, model), backend)
        try:
            if not room_checked:
                ticket.check_room()
            if task is not None and ticket.task is not task:
                raise RequestError(f"model {ticket.model!r} has task {ticket.task.name!r}; this route answers "
                                   f"{task.name} models only")
        except BaseException as e:
            ticket.close(e)
            raise
        return ticket

    async def answer(self, ticket: Ticket, given: Given, options: Any = None) -> Answer:
        """One input: a place in line (Busy at once if the line filled since the room check), the input prepared,
        the run, the task's reading; the answer with the model, the backend that ran it, the timings."""
        task = ticket.task
        options = task.ready(task.options() if options is None else options, ticket.model_dir)
        run = await runs.run(ticket, given, self.images)
        post_start = time.perf_counter()
        result = task.read(run, options)
        return Answer(model=ticket.model, backend=ticket.backend, result=result,
                      timing_ms=runs.finish(ticket, run, post_start), warmup=ticket.warmup, cold=run.cold)

    async def tensors(self, ticket: Ticket, inputs: Sequence[Given], backend: str | None = None) -> list[Tensors]:
        """Each input through the model on `backend` (default: the ticket's), read as the task's named tensors, in
        order. Every place in line is taken now, all or none (Busy from any gives back those taken), and on the
        first failure the other runs are cancelled and waited for: no input still runs once its place is given
        back."""
        if len(inputs) == 1 and backend in (None, ticket.backend):  # one input on the ticket's pool: its own place
            ticket.admit()
            return [await self._tensors(ticket, inputs[0])]
        with ExitStack() as places:
            tickets = _places(ticket, backend or ticket.backend, len(inputs), places)
            return await _all([self._tensors(each, given) for each, given in zip(tickets, inputs)])

    async def _tensors(self, ticket: Ticket, given: Given) -> Tensors:
        run = await runs.run(ticket, given, self.images)
        values = ticket.task.named_values(run)
        runs.finish(ticket, run)
        return Tensors(values, run.stages_ms, run.cold)


def _places(first: Ticket, backend: str, n: int, places: ExitStack) -> list[Ticket]:
    """n places in line on the held version, taken now (the inputs are here): the ticket's own when it is on
    `backend`, and more. All or none: Busy from any of them gives back those taken."""
    tickets = []
    if backend == first.backend:
        first.admit()
        tickets.append(first)
    # else: checked on the default backend's line, asked for another: that line serves, the ticket takes no place
    while len(tickets) < n:
        other = first.another(backend)
        places.callback(other.release)
        tickets.append(other)
    return tickets


async def _all(runs_: list[Coroutine]) -> list:
    """Every run, in order. On the first failure the others are cancelled and waited for."""
    if len(runs_) == 1:  # the common case, awaited as it is: no task (its creation and bookkeeping) for it
        return [await runs_[0]]
    tasks = [asyncio.ensure_future(each) for each in runs_]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
