"""Which models are served, on which backends, and whether they are ready; the versions' lifetimes.

Backends are plug-ins (app.engines): the registry drives each the same way and names none. So are
tasks (app.tasks): a model's task, named in its model.json, checks the model's outputs at load.
Discovery reads each configured model directory at start (its files are checked against their
sha256 when a version loads); app/registry/loading.py builds the versions, app/registry/versions.py
defines them and their leases, app/registry/status.py what clients see of their state.

A model version is a unit of lifetime. A load or reload builds a complete new version and
swaps it in under one lock; a request takes a lease on the version current when it starts
(`lease()`) and holds it until it is answered, so it never meets a closed interpreter. A
replaced version is retired: its interpreters are closed when its last lease ends. Reloads
of one model are serialized; a reload that fails leaves the old version serving and the
model "degraded", with the reason and when.

Admission comes first: `lease()` holds the version, and the caller (app/core) checks the pool's
bounded line (`Lease.check_room()`) before it reads a body, so an overloaded pool refuses in
microseconds; the request takes its place in line (`Lease.admit()`, which `Lease.run` and
`run_after` do first) once its input has arrived, before any work on it, so a client that sends
its body slowly holds no place that others could use. `resolve()` is the same resolution of model and backend without a lease, for
checks made before the application sees a request. Shutdown: `drain()` refuses new leases and
waits (bounded) for the admitted ones, then `close()` closes every version.

Devices come and go while the service runs (TPUs plugged in and unplugged): a plug-in that follows its
devices (Backend.follow, from `load_all()` on) calls `_devices_changed()` after each look. The pools of
that backend follow its devices (app/registry/devices.py); a model whose every device of a backend left
moves to the fallback its plug-in's policy gives, and back once the plug-in can serve it again
(Backend.recheck): each move is the reload that loses nothing, a new version swapped in, warmed up first.

Clients see file names relative to the model directory; full paths go to the log only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from pydantic import ValidationError

from app import metrics
from app.engines import BACKENDS, Backend, Fallback, MemberView
from app.errors import DeviceGone, ModelDirError, ModelNotFound, NotReady, ServeError, ShuttingDown
from app.model_dir.reading import ModelDir, discover, read_model_dir
from app.pool import EnginePool
from app.registry.devices import DeviceFollower
from app.registry.loading import Loader
from app.registry.status import SERVING, ModelStatus, current_status, iso
from app.registry.versions import Lease, ModelVersion
from app.settings import DEFAULTS, Settings, default_model_for
from app.tasks import TASKS, Task

log = logging.getLogger(__name__)

class Registry:
    def __init__(self, settings: Settings, backends: Mapping[str, type[Backend]] | None = None,
                 tasks: Mapping[str, Task] | None = None):
        self.settings = settings
        available = dict(BACKENDS if backends is None else backends)
        for key in settings.backends:
            if key not in available:
                raise ServeError(f"unknown backend {key!r} in settings; available: {sorted(available)}")
        unknown = sorted(set(settings.plugins) - set(available))
        if unknown:
            raise ServeError(f"settings for unknown backends {unknown}; available: {sorted(available)}")
        # every available plug-in: /v1/devices reports on backends that are not configured too
        self.plugins: dict[str, Backend] = {key: _make_plugin(cls, settings) for key, cls in available.items()}
        self._versions: dict[str, ModelVersion] = {}
        self._status: dict[str, ModelStatus] = {}
        self._paths: dict[str, Path] = {}
        self._dirs: dict[str, ModelDir] = {}
        self._fallbacks: dict[str, dict[str, Fallback]] = {}  # model -> requested backend -> fallback
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last lease ends
        self._active = 0
        self._draining = False
        self._reload_locks: dict[str, threading.Lock] = {}
        self._loaded = threading.Event()  # load_all has finished (each model ready or failed)
        # the tasks a model.json may name (app/tasks/): a model of another task fails to load, saying so
        self.tasks: dict[str, Task] = dict(TASKS if tasks is None else tasks)
        self.loader = Loader(settings, self.plugins, self.watched, self.tasks)
        self.devices = DeviceFollower(self.loader)

    @property
    def default_backend(self) -> str:
        """The first configured backend, or the one serving instead of it for every model."""
        return self._serving_instead(self.settings.backends[0])

    def served_backends(self) -> list[str]:
        """The backends a request can name, in configured order: a configured one that every model
        fell back from is replaced by the one serving instead of it."""
        return list(dict.fromkeys(self._serving_instead(key) for key in self.settings.backends))

    def _serving_instead(self, key: str) -> str:
        instead = {self._fallbacks.get(name, {}).get(key) for name in self._paths}
        if self._paths and None not in instead:
            backends = {f.backend for f in instead}
            if len(backends) == 1 and None not in backends:  # None: served by none instead
                return backends.pop()
        return key

    # -- start -------------------------------------------------------------------------------

    def configure(self) -> None:
        """Find and validate the configured model directories, check every backend's
        environment (fast; no interpreters yet). A ServeError here stops the service."""
        found = discover(self.settings.model_dir)
        wanted = self.settings.models or sorted(found)
        missing = [name for name in wanted if name not in found]
        if missing:
            raise ModelDirError(f"models {missing} not found in {self.settings.model_dir}; found {sorted(found)}")
        if not wanted:
            raise ModelDirError(f"no model directories (with model.json) in {self.settings.model_dir}")
        for name in wanted:
            model_dir = read_model_dir(found[name])
            if model_dir.name != name:
                raise ModelDirError(f"{found[name]}: model.json names {model_dir.name!r}, the directory {name!r}")
            self._paths[name] = found[name]
            self._dirs[name] = model_dir
            metrics.note_task(name, model_dir.manifest.task)
            self._status[name] = ModelStatus("loading", since=time.time())
            self._reload_locks[name] = threading.Lock()
        by_task = {default.task: [name for name in wanted if self._dirs[name].manifest.task == default.task]
                   for default in DEFAULTS}
        for default in DEFAULTS:  # settled once, here: every reader sees a served model of its task (or None)
            others = [name for task, names in by_task.items() if task != default.task for name in names]
            try:
                chosen = default_model_for(getattr(self.settings, default.setting), wanted, by_task[default.task],
                                           default, others)
            except ValueError as e:
                raise ServeError(str(e)) from None
            setattr(self.settings, default.setting, chosen)
        for key in self.settings.backends:
            for name, fallback in self.plugins[key].start(dict(self._dirs)).items():
                self._record_fallback(name, key, fallback)

    def _record_fallback(self, name: str, key: str, fallback: Fallback) -> Fallback:
        if fallback.backend is not None and fallback.backend not in self.plugins:
            raise ServeError(f"backend {key!r} falls back to {fallback.backend!r}, which is not available")
        recorded = self._fallbacks.setdefault(name, {})[key] = Fallback(fallback.backend, self._public(fallback.reason))
        return recorded

    def load_all(self) -> None:
        """Load (and, by setting, warm up) every configured model, then follow the configured backends'
        devices. Blocking: run off the event loop."""
        try:
            self._load_each()
        finally:
            self._loaded.set()
        for key in self.settings.backends:
            self.plugins[key].follow(_follower(self, key))

    def _load_each(self) -> None:
        for name in self._paths:
            with self._reload_locks[name]:  # a reload asked for meanwhile comes after, never under
                if name in self._versions:
                    continue
                try:
                    version = self._load(name, warm_up=self.settings.warmup_at_start, number=1)
                except ServeError as e:
                    metrics.model_loaded(name, ok=False)
                    log.error("model %s failed to load: %s", name, e)
                    with self._lock:
                        self._status[name] = ModelStatus("failed", self._public(str(e)), time.time())
                    continue
                with self._lock:
                    if self._draining:  # shut down while loading: nothing will serve it
                        version.close()
                        continue
                    self._versions[name] = version
                    self._status[name] = ModelStatus("ready", since=time.time())
                metrics.model_loaded(name, ok=True)

    def wait_loaded(self, timeout_s: float) -> bool:
        """Block until load_all has finished, at most timeout_s."""
        return self._loaded.wait(timeout_s)

    # -- reload --------------------------------------------------------------------------------

    def reload(self, name: str) -> ModelVersion:
        """Load again from disk (files re-checked) without warm-up, and swap it in. Blocking.

        Serialized per model. On failure the version already serving keeps serving and the
        model is "degraded" until a reload succeeds."""
        if name not in self._paths:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        with self._reload_locks[name]:
            return self._reload_locked(name, warm_up=False)

    def _reload_locked(self, name: str, warm_up: bool) -> ModelVersion:
        """reload(), its lock held: also the move between a fallback and a backend, warmed up first."""
        current = self._versions.get(name)
        try:
            self._dirs[name] = read_model_dir(self._paths[name])
            metrics.note_task(name, self._dirs[name].manifest.task)
            fresh = self._load(name, warm_up=warm_up, number=(current.number + 1) if current else 1)
        except ServeError as e:
            metrics.model_loaded(name, ok=False)
            log.error("reload of %s failed: %s", name, e)
            self._public_error(e)
            with self._lock:
                current = self._versions.get(name)
                if current is None:
                    self._status[name] = ModelStatus("failed", str(e), time.time())
                else:
                    self._status[name] = ModelStatus(
                        "degraded", f"reload failed: {e}; still serving version {current.number} loaded at "
                        f"{iso(current.loaded_at)}", time.time())
            raise
        metrics.model_loaded(name, ok=True)
        with self._lock:
            if self._draining:
                fresh.close()
                raise ShuttingDown("the service is shutting down: reload refused")
            old = self._versions.get(name)
            self._versions[name] = fresh
            self._status[name] = ModelStatus("ready", since=time.time())
            close_old = old is not None and self._retire(old)
        if close_old:
            old.close()
        log.info("model %s: version %d serving%s", name, fresh.number,
                 f", version {old.number} retired" if old else "")
        return fresh

    def _retire(self, version: ModelVersion) -> bool:
        """Under the lock: mark retired; True if no lease holds it (close it now)."""
        version.retired = True
        return version.leases == 0

    # -- leases ------------------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, name: str, backend: str | None = None) -> AsyncIterator[Lease]:
        """Hold the model's current version until the block ends, for its pool on `backend` (default: the
        default backend). Refuses at once when the model is not serving or the backend not loaded for it; the
        caller checks the pool's room (`Lease.check_room()`) before it reads its input, and takes its place
        (`Lease.admit()`) once the input is here."""
        version = self._hold(name)
        try:
            key = self.backend_for(version, backend)
            lease = Lease(version, key, version.pool(key))
            try:
                yield lease
            finally:
                lease.release()
        finally:
            self._let_go(version)

    def resolve(self, name: str, backend: str | None = None) -> tuple[ModelVersion, str]:
        """The version serving `name` now and the backend a request naming `backend` (None: the
        default) is served on, resolved as lease() does, without holding anything: for checks made
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
        """The backend and pool whose room lease(name, backend) would check now, without holding the
        version (load shedding from a request's head: app/api/shedding.py); None where lease() would
        refuse for another reason (a model not serving, a backend not loaded for it)."""
        try:
            version, key = self.resolve(name, backend)
        except ServeError:
            return None
        return key, version.pool(key)

    def _hold(self, name: str) -> ModelVersion:
        with self._lock:
            if self._draining:
                raise ShuttingDown("the service is shutting down")
            version = self._versions.get(name)
            if version is None:
                raise self._not_serving(name)
            version.leases += 1
            self._active += 1
            return version

    def _let_go(self, version: ModelVersion) -> None:
        with self._lock:
            version.leases -= 1
            self._active -= 1
            close = version.retired and version.leases == 0
            if self._active == 0:
                self._idle.notify_all()
        if close:
            version.close()

    @property
    def host_cpu(self) -> bool:
        """Whether some backend serving a model (a fallback included) computes on the host's cores."""
        keys = set(self.settings.backends)
        keys |= {f.backend for per_model in self._fallbacks.values() for f in per_model.values() if f.backend}
        return any(self.plugins[key].host_cpu for key in keys)

    @property
    def active(self) -> int:
        """Leases held now: requests admitted and not yet answered."""
        return self._active

    @property
    def draining(self) -> bool:
        """Shutting down (drain() or close() began): new leases are refused."""
        return self._draining

    # -- shutdown -----------------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new leases and wait until the admitted ones end, at most timeout_s. True if
        every request was answered in time."""
        with self._lock:
            self._draining = True
            if self._active == 0:
                return True
        log.info("draining: %d request(s) in flight, up to %.1f s", self._active, timeout_s)
        return await asyncio.to_thread(self._wait_idle, timeout_s)

    def _wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout_s)

    def close(self) -> None:
        """Stop following devices, close every version (a version still leased closes when its last lease
        ends) and wait, bounded, for the interpreters to be released."""
        with self._lock:
            self._draining = True
        for plugin in self.plugins.values():
            plugin.close()
        with self._lock:
            versions = list(self._versions.values())
            to_close = [v for v in versions if self._retire(v)]
        for version in to_close:
            version.close()
        deadline = time.monotonic() + self.settings.close_timeout_s  # for the interpreters' threads to close them
        for version in to_close:
            for pool in version.pools.values():
                pool.join(max(0.0, deadline - time.monotonic()))

    # -- what clients see ---------------------------------------------------------------------------

    def status(self, name: str) -> ModelStatus:
        """The stored state, and what happened since: a fallback, devices the watchdog took out."""
        version = self._versions.get(name)
        problems = {key: self.plugins[key].device_problems() for key in version.pools} if version else None
        return current_status(self._status[name], version, problems)

    def status_or_raise(self, name: str) -> ModelStatus:
        if name not in self._status:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        return self.status(name)

    def ready(self) -> bool:
        """Every model serving (ready, or degraded but answering)."""
        return bool(self._status) and all(self.status(name).state in SERVING for name in self._status)

    def default_for(self, task: str) -> str | None:
        """The model a request of `task` that names none goes to (settled at start), None when none is served."""
        for default in DEFAULTS:
            if default.task == task:
                return getattr(self.settings, default.setting)
        return None

    def names(self) -> list[str]:
        return list(self._paths)

    def serving(self, name: str) -> ModelVersion | None:
        """The version serving now, if any."""
        return self._versions.get(name)

    def get(self, name: str) -> ModelVersion:
        """The version serving now (for describing it; requests take a lease instead)."""
        version = self._versions.get(name)
        if version is None:
            raise self._not_serving(name)
        return version

    def model_dir(self, name: str) -> ModelDir:
        """The model directory as last read (from the serving version, or at start)."""
        version = self._versions.get(name)
        return version.model_dir if version else self._dirs[name]

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

    def watched(self, key: str) -> bool:
        """Whether the watchdog watches this backend's interpreters: as the settings say, else as its plug-in does."""
        if self.settings.watchdog_backends is not None:
            return key in self.settings.watchdog_backends
        return self.plugins[key].watched

    def _not_serving(self, name: str) -> ServeError:
        status = self._status.get(name)
        if status is None:
            return ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        detail = f": {status.error}" if status.error else ""
        return NotReady(f"model {name!r} is {status.state}{detail}")

    def _public(self, text: str) -> str:
        """File names relative to the model directory: clients never see the host's paths."""
        for root in {str(self.settings.model_dir.resolve()), str(self.settings.model_dir)}:
            text = text.replace(root.rstrip(os.sep) + os.sep, "")
        return text

    def _public_error(self, error: ServeError) -> None:
        """Redact an error's message in place, after it has been logged in full."""
        if error.args and isinstance(error.args[0], str):
            error.args = (self._public(error.args[0]), *error.args[1:])

    # -- devices coming and going --------------------------------------------------------------------

    def _devices_changed(self, key: str, changed: bool) -> None:
        """After a look of backend `key`'s plug-in at its devices (on its thread): each model in turn, under
        its reload lock, moves back from a fallback (when the devices changed and the plug-in can serve it
        now), or has its pool follow the devices, and moves to its fallback if every device left."""
        plugin = self.plugins[key]
        offered = self.devices.offered(plugin)
        for name in list(self._paths):
            with self._reload_locks[name]:
                if self._draining:
                    return
                fallback = self._fallbacks.get(name, {}).get(key)
                if fallback is not None:
                    if changed and fallback.backend is not None:
                        self._move_back(name, key, fallback)
                    continue
                version = self._versions.get(name)
                pool = version.pools.get(key) if version is not None else None
                if pool is None:
                    continue
                self.devices.follow(pool, plugin, version.model_dir, offered)
                if pool.departed:
                    self._move_off(name, key, version, pool)

    def _move_back(self, name: str, key: str, fallback: Fallback) -> None:
        """A model served on its fallback: on `key` again if its plug-in can serve it now."""
        still = self.plugins[key].recheck(self._dirs[name])
        if still is not None:  # not yet: the reason readiness gives is the one that holds now
            self._fallbacks[name][key] = Fallback(fallback.backend, self._public(still.reason))
            return
        del self._fallbacks[name][key]
        log.info("model %s: %s can serve it again: loading it there (it stays on %s meanwhile)", name, key,
                 fallback.backend)
        try:
            self._reload_locked(name, warm_up=True)
        except ServeError as e:
            self._fallbacks.setdefault(name, {}).setdefault(key, fallback)
            log.warning("model %s: still on %s: %s", name, fallback.backend, e)

    def _move_off(self, name: str, key: str, version: ModelVersion, pool: EnginePool) -> None:
        """Every device of `key` serving the model left: to the fallback its plug-in's policy gives (the
        requests waiting meanwhile go to the version's pool on that backend, if it has one), or the requests
        waiting are answered now (503 + Retry-After) and the model waits, unhealthy, for a device."""
        devices = ", ".join(dict.fromkeys(s.device for m in pool.members for s in m.stages if s.device))
        gone = DeviceGone(f"every {key} device serving it left ({devices}): not listed any more (unplugged?); "
                          "until one is back", self.settings.retry_after_s)
        fallback = self.plugins[key].fall_back(name, gone)
        if fallback is None or fallback.backend is None:
            refused = pool.refuse_waiting(str(gone))
            if refused:
                log.warning("model %s: %d waiting request(s) answered 503: %s", name, refused, gone)
            return
        self._record_fallback(name, key, fallback)
        instead = version.pools.get(fallback.backend)
        if instead is not None and (instead.inputs, instead.outputs) == (pool.inputs, pool.outputs):
            pool.hand_over(instead)
        try:
            self._reload_locked(name, warm_up=True)
        except ServeError as e:
            log.error("model %s: moving it to %s failed: %s", name, fallback.backend, e)
        pool.refuse_waiting(str(gone))  # whatever could not be handed over is answered now

    # -- loading --------------------------------------------------------------------------------------

    def _load(self, name: str, warm_up: bool, number: int) -> ModelVersion:
        return self.loader.load_version(self._dirs[name], number, warm_up, self._fallbacks.get(name, {}),
                                        lambda key, fallback: self._record_fallback(name, key, fallback))


def _follower(registry: Registry, key: str):
    """What a plug-in calls after each look at its devices: the registry's `_devices_changed`, held weakly
    (a plug-in's thread never keeps a registry alive); False once the registry is gone or shutting down."""
    ref = weakref.ref(registry)

    def changed(devices_changed: bool) -> bool:
        registry = ref()
        if registry is None or registry._draining:
            return False
        registry._devices_changed(key, devices_changed)
        return True

    return changed


def _make_plugin(cls: type[Backend], settings: Settings) -> Backend:
    """The plug-in, with its own settings read: a wrong value stops the start, naming its variable."""
    try:
        return cls(settings)
    except ValidationError as e:
        prefix = cls.settings_class.model_config.get("env_prefix", "") if cls.settings_class else ""
        problems = "; ".join(f"{prefix}{str(error['loc'][0]).upper() if error['loc'] else ''}: {error['msg']} "
                             f"(got {error.get('input')!r})" for error in e.errors())
        raise ServeError(f"settings of backend {cls.key!r}: {problems}") from None
