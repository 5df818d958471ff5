"""Which models are served, on which backends, and whether they are ready: the registry the core asks (no door does).

Backends are plug-ins (app.engines): the registry drives each the same way and names none. So are
tasks (app.tasks): a model's task, named in its model.json, checks the model's outputs at load.
The registry composes its parts, each a module of this package, dependencies pointing down:
  - startup.py: what start-up settles once (the plug-ins, the model directories, each task's default model);
  - fallbacks.py: which backend serves a model instead of another, and why;
  - loading.py: building a version (a pool per backend; a backend that cannot run the model leaves it
    degraded on that backend only, and the model serves on the others);
  - lifetimes.py: each model's state and current version, swapped in whole on a reload;
  - devices.py: pools and models following their backend's devices (TPUs plugged in and unplugged);
  - versions.py: a version; tickets.py: a request's hold on one and its place in line; status.py: what clients
    see of a model's state.

A model version is a unit of lifetime. A load or reload builds a complete new version and swaps it in under one
lock; a request holds the version current when it starts through its ticket (`ticket()`: the version and its place
in line on one of its pools, app/registry/tickets.py) until it is answered, so it never meets a closed interpreter.
A replaced version is retired: its interpreters are closed when the last request holding it ends. Reloads of one
model are serialized; a reload that fails leaves the old version serving and the model "degraded", with the reason
and when. `resolve()` is the ticket's resolution of model and backend without holding anything, for checks made
before the application sees a request. Shutdown: `drain()` refuses new tickets and waits (bounded) for the
requests holding one, then `close()` closes every version.

Clients see file names relative to the model directory; full paths go to the log only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from app import metrics
from app.engines import BACKENDS, Backend, MemberView
from app.errors import ModelDirError, ModelNotFound, ServeError, ShuttingDown
from app.model_dir.reading import read_model_dir
from app.pool import EnginePool
from app.registry.devices import DeviceFollower, DeviceMoves
from app.registry.fallbacks import Fallbacks
from app.registry.lifetimes import Lifetimes
from app.registry.loading import Loader
from app.registry.startup import Defaults, choose_defaults, find_models, make_plugins
from app.registry.status import SERVING, ModelStatus, current_status
from app.registry.tickets import Ticket
from app.registry.versions import ModelVersion
from app.settings import Settings
from app.tasks import TASKS, Task

log = logging.getLogger(__name__)


class Registry:
    def __init__(self, settings: Settings, backends: Mapping[str, type[Backend]] | None = None,
                 tasks: Mapping[str, Task] | None = None):
        self.settings = settings
        # every available plug-in: /v1/devices reports on backends that are not configured too
        self.plugins: dict[str, Backend] = make_plugins(settings, BACKENDS if backends is None else backends)
        # the tasks a model.json may name (app/tasks/): a model of another task fails to load, saying so
        self.tasks: dict[str, Task] = dict(TASKS if tasks is None else tasks)
        self.loader = Loader(settings, self.plugins, self.tasks)
        self.fallbacks = Fallbacks(self.plugins, settings.model_dir)
        self.models = Lifetimes(settings, self.loader, self.fallbacks)
        self.devices = DeviceFollower(self.loader)
        self.moves = DeviceMoves(self.models, self.fallbacks, self.plugins, self.devices, settings.retry_after_s)
        self.defaults = Defaults()  # each task's default model, settled by configure()
        self._versions = self.models.versions  # the version serving each model now (swapped in place)

    # -- start -------------------------------------------------------------------------------

    def configure(self) -> None:
        """Find and validate the configured model directories, settle each task's default model, check every
        configured backend's environment (fast; no interpreters yet). A ServeError here stops the service."""
        found = find_models(self.settings)
        self.defaults = choose_defaults(self.settings, {name: d.manifest.task for name, (_, d) in found.items()})
        self.models.add(found)
        for key in self.settings.backends:
            for name, fallback in self.plugins[key].start(dict(self.models.dirs)).items():
                self.fallbacks.record(name, key, fallback)

    def default_for(self, task: str) -> str | None:
        """The model a request of `task` (model.json's task name: "classification", "detection") that names none
        goes to, as settled at start; None where the task has none (no model of it is served)."""
        return self.defaults.of(task)

    def load_all(self) -> None:
        """Load (and, by setting, warm up) every configured model, then follow the configured backends'
        devices. Blocking: run off the event loop."""
        self.models.load_each(self.settings.warmup_at_start)
        for key in self.settings.backends:
            self.plugins[key].follow(self.moves.listener(key))

    def add(self, path: Path) -> ModelVersion:
        """A model directory written while serving (a client's upload: app/frontdoors/uploads.py), loaded and
        warmed up on the configured backends, then served under its name. Blocking: run off the event loop.

        Never replaces: a model of that name already here is a ModelDirError. A model that no configured backend
        can run here (a compiled-only file without an Edge TPU in service) is not added: the first backend's error,
        or a ModelDirError with each backend's reason. A failed load leaves the registry as it was (the caller
        removes the directory)."""
        model_dir = read_model_dir(path)
        name, models = model_dir.name, self.models
        # each configured backend's word on this one model, as when its devices change (Backend.recheck never raises)
        decided = {key: fallback for key in self.settings.backends
                   if (fallback := self.plugins[key].recheck(model_dir)) is not None}
        with models.lock:
            if models.draining:
                raise ShuttingDown("the service is shutting down: no model is added")
            if name in models.paths:
                raise ModelDirError(f"a model named {name!r} is served already: it is not replaced")
            models.add({name: (Path(path), model_dir)})
        try:
            for key, fallback in decided.items():
                self.fallbacks.record(name, key, fallback)
            with models.reload_locks[name]:
                version = self.loader.load_version(model_dir, 1, True, self.fallbacks.of(name))
            if not version.pools:
                version.close()
                reasons = "; ".join(f"{key}: {f.reason}" for key, f in version.fallbacks.items())
                raise ModelDirError(f"model {name!r}: no backend here runs it ({reasons})")
        except BaseException:
            with models.lock:
                for table in (models.paths, models.dirs, models.states, models.reload_locks):
                    table.pop(name, None)
            self.fallbacks.keep(name, {})
            metrics.model_loaded(name, ok=False)
            raise
        with models.lock:
            models.versions[name] = version
            models.states[name] = ModelStatus("ready", since=time.time())
        self.fallbacks.keep(name, version.fallbacks)
        metrics.model_loaded(name, ok=True)
        log.info("model %s: added from %s and serving", name, path)
        return version

    def wait_loaded(self, timeout_s: float) -> bool:
        """Block until load_all has finished, at most timeout_s."""
        return self.models.loaded.wait(timeout_s)

    def reload(self, name: str) -> ModelVersion:
        """Load again from disk (files re-checked) without warm-up, and swap it in. Blocking.

        Serialized per model. The backends the model was not served on are tried again where their plug-in
        can serve it now. On failure the version already serving keeps serving and the model is "degraded"
        until a reload succeeds."""
        if name not in self.models.paths:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self.models.paths)}")
        with self.models.reload_locks[name]:
            return self.models.reload(name, warm_up=False, recheck=True)

    # -- tickets -----------------------------------------------------------------------------------

    def ticket(self, name: str, backend: str | None = None) -> Ticket:
        """`async with registry.ticket(name, backend) as ticket`: the model's current version, held until the block
        ends, and its pool on `backend` (default: the default backend), where the ticket takes its place in line.
        Refuses at once when the model is not serving or the backend not loaded for it; the caller checks the
        pool's room (`Ticket.check_room()`) before it reads its input, and takes its place (`Ticket.admit()`) once
        the input is here."""
        version = self.models.hold(name)
        try:
            return Ticket(version, self.backend_for(version, backend), self.models)
        except BaseException:
            self.models.let_go(version)
            raise

    def resolve(self, name: str, backend: str | None = None) -> tuple[ModelVersion, str]:
        """The version serving `name` now and the backend a request naming `backend` (None: the
        default) is served on, resolved as ticket() does, without holding anything: for checks made
        before the application sees the request (shedding from the request head). Raises what the
        request would get: ModelNotFound, NotReady, BackendNotAvailable."""
        version = self.get(name)
        return version, self.backend_for(version, backend)

    def backend_for(self, version: ModelVersion, backend: str | None) -> str:
        """The backend a request is served on. Named: that one. Not named: the first configured backend that
        serves the version, or that the version held serves it on instead (a model moves between its fallback and
        a backend while serving: the version decides, not what the registry has decided since)."""
        if backend is None:
            backend = self.settings.backends[0]  # serving nowhere: version.pool() below says why
            for key in self.settings.backends:
                fallback = version.fallbacks.get(key)
                instead = fallback.backend if fallback is not None else None
                if key in version.pools or instead in version.pools:
                    backend = key if key in version.pools else instead
                    break
        version.pool(backend)  # BackendNotAvailable, saying why (a fallback, say); "" is a wrong name
        return backend

    def pool_for(self, name: str, backend: str | None = None) -> tuple[str, EnginePool] | None:
        """The backend and pool whose room ticket(name, backend) would check now, without holding the
        version (load shedding from a request's head: app/api/shedding.py); None where ticket() would
        refuse for another reason (a model not serving, a backend not loaded for it)."""
        try:
            version, key = self.resolve(name, backend)
        except ServeError:
            return None
        return key, version.pool(key)

    @property
    def active(self) -> int:
        """Requests holding a ticket now: admitted and not yet answered."""
        return self.models.active

    @property
    def draining(self) -> bool:
        """Shutting down (drain() or close() began): new tickets are refused."""
        return self.models.draining

    # -- shutdown -----------------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new tickets and wait until the requests holding one end, at most timeout_s. True if every request
        was answered in time."""
        models = self.models
        with models.lock:
            models.draining = True
            if models.active == 0:
                return True
        log.info("draining: %d request(s) in flight, up to %.1f s", models.active, timeout_s)
        return await asyncio.to_thread(models.wait_idle, timeout_s)

    def close(self) -> None:
        """Stop following devices, close every version (a version still held closes when the last request holding
        it ends) and wait, bounded, for the interpreters to be released."""
        with self.models.lock:
            self.models.draining = True
        for plugin in self.plugins.values():
            plugin.close()
        with self.models.lock:
            versions = list(self._versions.values())
            to_close = [v for v in versions if self.models.retire(v)]
        for version in to_close:
            version.close()
        deadline = time.monotonic() + self.settings.close_timeout_s  # for the interpreters' threads to close them
        for version in to_close:
            for pool in version.pools.values():
                pool.members.join(max(0.0, deadline - time.monotonic()))

    # -- what clients see ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.models.paths)

    def status(self, name: str) -> ModelStatus:
        """The stored state, and what happened since: a fallback, devices the watchdog took out. ModelNotFound
        for a name that is not served."""
        stored = self.models.states.get(name)
        if stored is None:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self.models.paths)}")
        version = self._versions.get(name)
        problems = {key: self.plugins[key].device_problems() for key in version.pools} if version else None
        return current_status(stored, version, problems)

    def ready(self) -> bool:
        """Every model serving (ready, or degraded but answering: on some backend)."""
        states = self.models.states
        return bool(states) and all(self.status(name).state in SERVING for name in states)

    def serving(self, name: str) -> ModelVersion | None:
        """The version serving now, if any."""
        return self._versions.get(name)

    def get(self, name: str) -> ModelVersion:
        """The version serving now (for describing it; requests hold theirs through a ticket instead)."""
        version = self._versions.get(name)
        if version is None:
            raise self.models.not_serving(name)
        return version

    @property
    def default_backend(self) -> str:
        """The first configured backend, or the one serving instead of it for every model."""
        return self.fallbacks.serving_instead(self.settings.backends[0], self.names())

    def served_backends(self) -> list[str]:
        """The backends a request can name, in configured order: a configured one that every model
        fell back from is replaced by the one serving instead of it."""
        return list(dict.fromkeys(self.fallbacks.serving_instead(key, self.names()) for key in self.settings.backends))

    @property
    def host_cpu(self) -> bool:
        """Whether some backend serving a model (a fallback included) computes on the host's cores."""
        keys = set(self.settings.backends) | self.fallbacks.backends()
        return any(self.plugins[key].host_cpu for key in keys)

    def members(self, backend: str) -> list[MemberView]:
        """Every pool member of `backend` serving now, of every model, as its plug-in sees them (its reports)."""
        return [MemberView(name, member.device, member.healthy, member.problem, member.load_ms,
                           member.first_inference_ms, member.options)
                for name, version in self._versions.items()
                if backend in version.pools for member in version.pools[backend].members]

    def reports(self) -> dict[str, dict]:
        """What each available plug-in says about itself and its devices (GET /v1/devices), by key;
        plug-ins with nothing to report are left out."""
        reports = {key: plugin.report(self.members(key)) for key, plugin in self.plugins.items()}
        return {key: report for key, report in reports.items() if report is not None}

