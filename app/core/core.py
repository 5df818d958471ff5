"""The entry of the core: which model and backend a request goes to (`Core.target`: the one resolution, used by the
HTTP head check and by every front door alike), the hold on that model's current version with its room check
(`Core.hold`), and one input through it to the task's answer (`Held.answer`), or a batch of inputs to the task's
named tensors (`Held.tensors`, for tensor protocols).

A front door calls it the same way whatever its wire format:

    async with core.hold(task, model, backend) as held:  # the version, and a 503 at once if the line is full
        given = ...  # read the body: an ImageInput or a TensorInput
        answer = await held.answer(given, options)  # a place in line, the run, the task's reading
    # or, where the input is already here: answer = await core.infer(task, model, backend, given, options)

Admission before work: the hold checks the pool's line before the door reads its input, so a full line answers
at once whatever a body is doing; the place in line is taken once the input is here (a slow body holds none).
A door whose HTTP head check already made the room check says so (`room_checked`), and the request is checked
once. Errors are the domain's (app/errors.py); one raised once the model and backend are known carries them
(`ServeError.target`), so a door can count a refusal under the model it was for: the core calls nobody back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from app.core import runs
from app.core.images import ImageWork
from app.core.inputs import Given
from app.engines import TensorSpec
from app.errors import ModelNotFound, RequestError, ServeError
from app.model_dir.reading import ModelDir
from app.registry import Lease, ModelVersion, Registry
from app.tasks import Answer, Outputs, Task


class Target(NamedTuple):
    """Where a request goes: the model's name and the backend that serves it."""

    model: str
    backend: str


@dataclass(frozen=True)
class Tensors:
    """One input of a batch read as its task's named tensors (a tensor protocol's outputs), with its run's stages."""

    values: dict[str, np.ndarray]
    stages_ms: dict[str, float]
    cold: bool


class Core:
    """The request path as a library: give it a task, a model (None: the task's default), a backend (None: the
    default) and an input; get the task's answer."""

    def __init__(self, registry: Registry, images: ImageWork):
        self.registry = registry
        self.images = images

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

    def target(self, task: Task | None, model: str | None, backend: str | None) -> Target:
        """The model and the backend a request naming `model` and `backend` (None: the defaults) goes to now,
        without holding anything. Raises what the request would get (ModelNotFound, NotReady, BackendNotAvailable)."""
        name = self.model_of(task, model)
        _, key = self.registry.resolve(name, backend)
        return Target(name, key)

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
             room_checked: bool = False) -> Holding:
        """`async with core.hold(...) as held`: hold the model's current version until the block ends (a reload
        meanwhile never closes it under the request), on its pool for `backend`, with its room check unless the
        request had it (`room_checked`); `task` None: any task's model (a tensor protocol reads the task's named
        tensors). A ServeError raised once the lease is held carries its target (`ServeError.target`)."""
        return Holding(self, task, model, backend, room_checked)

    async def infer(self, task: Task, model: str | None, backend: str | None, given: Given,
                    options: Any = None) -> Answer:
        """One input already at hand through the model to its task's answer (a door with no body to read)."""
        async with self.hold(task, model, backend) as held:
            return await held.answer(given, options)


class Holding:
    """Core.hold(): a class rather than a generator (asynccontextmanager), as Registry.lease() is: every request
    enters one."""

    __slots__ = ("_core", "_task", "_model", "_backend", "_room_checked", "_name", "_leasing", "_lease")

    def __init__(self, core: Core, task: Task | None, model: str | None, backend: str | None, room_checked: bool):
        self._core = core
        self._task = task
        self._model = model
        self._backend = backend
        self._room_checked = room_checked

    async def __aenter__(self) -> Held:
        core, task = self._core, self._task
        name = self._name = core.model_of(task, self._model)
        leasing = self._leasing = core.registry.lease(name, self._backend)
        lease = self._lease = leasing.enter()
        try:
            if not self._room_checked:
                lease.check_room()
            if task is not None and lease.task is not task:
                raise RequestError(f"model {name!r} has task {lease.task.name!r}; this route answers {task.name} "
                                   "models only")
        except BaseException as e:
            self._exit(e)
            raise
        return Held(lease, lease.task if task is None else task, core.images)

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._exit(exc)

    def _exit(self, exc: BaseException | None) -> None:
        try:
            self._leasing.exit()
        finally:
            if isinstance(exc, ServeError) and exc.target is None:
                exc.target = Target(self._name, self._lease.backend)


class Held:
    """A request's hold on one model version and its pool (a lease), with what the core does on it."""

    def __init__(self, lease: Lease, task: Task, images: ImageWork):
        self.lease = lease
        self.task = task
        self.images = images

    @property
    def model(self) -> str:
        return self.lease.model_dir.name

    @property
    def backend(self) -> str:
        """The backend serving the request (after a run: the one that ran it)."""
        return self.lease.backend

    @property
    def model_dir(self) -> ModelDir:
        return self.lease.model_dir

    @property
    def version(self) -> ModelVersion:
        return self.lease.version

    def input_of(self, backend: str | None = None) -> TensorSpec:
        """The model's input tensor on `backend`'s pool (default: the held one's)."""
        return self.lease.input if backend is None else self.version.pool(backend).inputs[0]

    async def answer(self, given: Given, options: Any = None) -> Answer:
        """One input: a place in line (Busy at once if the line filled since the room check), the run, the task's
        reading; the answer with the model, the backend that ran it, the timings."""
        task, lease = self.task, self.lease
        options = task.ready(task.options() if options is None else options, lease.model_dir)
        run = await runs.run(lease, given, self.images)
        post_start = time.perf_counter()
        result = task.read(Outputs(run.outputs, lease.roles, lease.model_dir, run.geometry), options)
        return Answer(model=lease.model_dir.name, backend=lease.backend, result=result,
                      timing_ms=runs.finish(lease, run, post_start), warmup=lease.warmup, cold=run.cold)

    async def tensors(self, inputs: Sequence[Given], backend: str | None = None) -> list[Tensors]:
        """Each input through the model on `backend` (default: the held one), read as the task's named tensors,
        in order. Every place in line is taken now, all or none (Busy from any gives back those taken), and on
        the first failure the other runs are cancelled and waited for: no input still runs once its place is
        given back."""
        lease = self.lease
        if len(inputs) == 1 and backend in (None, lease.backend):  # one input on the held pool: its own place
            lease.admit()
            return [await self._tensors(lease, inputs[0])]
        with ExitStack() as places:
            leases = _places(self.lease, backend or self.lease.backend, len(inputs), places)
            return await _all([self._tensors(lease, given) for lease, given in zip(leases, inputs)])

    async def _tensors(self, lease: Lease, given: Given) -> Tensors:
        run = await runs.run(lease, given, self.images)
        values = self.task.named_values(Outputs(run.outputs, lease.roles, lease.model_dir, run.geometry))
        runs.finish(lease, run)
        return Tensors(values, run.stages_ms, run.cold)


def _places(first: Lease, backend: str, n: int, places: ExitStack) -> list[Lease]:
    """n places in line on the leased version, taken now (the input is here): the lease's own when it is on
    `backend`, and more. All or none: Busy from any of them gives back those taken."""
    if backend == first.backend:
        first.admit()
        return [first] + [places.enter_context(first.another()) for _ in range(n - 1)]
    # checked on the default backend's line, asked for another: that line serves, the lease takes no place
    return [places.enter_context(first.another(backend)) for _ in range(n)]


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
