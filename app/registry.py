"""Which models are served, on which backends, and whether they are ready; the versions' lifetimes.

Backends are plug-ins (app.engines): the registry drives each the same way and names none.
Each model directory is read and its files checked against their sha256 at load.

A model version is a unit of lifetime. A load or reload builds a complete new version and
swaps it in under one lock; a request takes a lease on the version current when it starts
(`lease()`) and holds it until it is answered, so it never meets a closed interpreter. A
replaced version is retired: its interpreters are closed when its last lease ends. Reloads
of one model are serialized; a reload that fails leaves the old version serving and the
model "degraded", with the reason and when.

Admission comes first: `lease()` holds the version and checks the pool's bounded line before
the caller reads a body, so an overloaded pool refuses in microseconds; the request takes its
place in line (`Lease.admit()`, which `Lease.run` and `run_after` do first) once its input has
arrived, before any work on it, so a client that sends its body slowly holds no place that
others could use. Shutdown: `drain()` refuses new leases and waits (bounded) for the admitted
ones, then `close()` closes every version.

Clients see file names relative to the model directory; full paths go to the log only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app import metrics
from app.engines import BACKENDS, Backend, EngineOptions, Fallback
from app.errors import (
    BackendNotAvailable,
    ModelDirError,
    ModelNotFound,
    NotReady,
    ServeError,
    ShuttingDown,
)
from app.imaging import InputQuantizer
from app.model_dir import ModelDir, discover, read_model_dir
from app.pipeline import pipeline_members
from app.pool import EnginePool, Member, Place, RunResult, Watchdog
from app.settings import Settings

log = logging.getLogger(__name__)

# How long close() waits for interpreter threads to close their interpreters.
CLOSE_JOIN_S = 5.0


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


@dataclass
class ModelStatus:
    state: str  # loading | ready | degraded | unhealthy | failed
    error: str | None = None
    since: float | None = None  # when this state began (unix time)


SERVING = ("ready", "degraded")


class Registry:
    def __init__(self, settings: Settings, backends: Mapping[str, type[Backend]] | None = None):
        self.settings = settings
        available = dict(BACKENDS if backends is None else backends)
        for key in settings.backends:
            if key not in available:
                raise ServeError(f"unknown backend {key!r} in settings; available: {sorted(available)}")
        # every available plug-in: /v1/devices reports on backends that are not configured too
        self.plugins: dict[str, Backend] = {key: cls(settings) for key, cls in available.items()}
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
            if len(backends) == 1:
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
            self._status[name] = ModelStatus("loading", since=time.time())
            self._reload_locks[name] = threading.Lock()
        for key in self.settings.backends:
            for name, fallback in self.plugins[key].start(dict(self._dirs)).items():
                self._record_fallback(name, key, fallback)

    def _record_fallback(self, name: str, key: str, fallback: Fallback) -> None:
        if fallback.backend not in self.plugins:
            raise ServeError(f"backend {key!r} falls back to {fallback.backend!r}, which is not available")
        self._fallbacks.setdefault(name, {})[key] = Fallback(fallback.backend, self._public(fallback.reason))

    def load_all(self) -> None:
        """Load (and, by setting, warm up) every configured model. Blocking: run off the event loop."""
        try:
            self._load_each()
        finally:
            self._loaded.set()

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
            current = self._versions.get(name)
            try:
                self._dirs[name] = read_model_dir(self._paths[name])
                fresh = self._load(name, warm_up=False, number=(current.number + 1) if current else 1)
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
                            f"{_iso(current.loaded_at)}", time.time())
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
        """Hold the model's current version until the block ends, for its pool on `backend`
        (default: the default backend). Refuses at once (NotReady, Busy, ...) when the pool's
        line is full now; the caller takes its place with `Lease.admit()` once its input is read."""
        version = self._hold(name)
        try:
            key = self._backend_key(backend)
            pool = version.pool(key)
            metrics.note_model(name, key)  # a refusal from here on is counted against this model
            pool.check_room()
            lease = Lease(version, key, pool)
            try:
                yield lease
            finally:
                lease.release()
        finally:
            self._let_go(version)

    def pool_for(self, name: str, backend: str | None = None) -> tuple[str, EnginePool] | None:
        """The backend and pool whose room lease(name, backend) would check now, without holding the
        version (load shedding from a request's head: app/api/shedding.py); None where lease() would
        refuse for another reason (a model not serving, a backend not loaded for it)."""
        version = self._versions.get(name)
        if version is None:
            return None
        key = self._backend_key(backend)
        pool = version.pools.get(key)
        return None if pool is None else (key, pool)

    def _backend_key(self, backend: str | None) -> str:
        return self.default_backend if backend is None else backend  # "" is a wrong name, not the default

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
        keys |= {f.backend for per_model in self._fallbacks.values() for f in per_model.values()}
        return any(self.plugins[key].host_cpu for key in keys)

    @property
    def active(self) -> int:
        """Leases held now: requests admitted and not yet answered."""
        return self._active

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
        """Close every version (a version still leased closes when its last lease ends) and wait,
        bounded, for the interpreters to be released."""
        with self._lock:
            self._draining = True
            versions = list(self._versions.values())
            to_close = [v for v in versions if self._retire(v)]
        for version in to_close:
            version.close()
        deadline = time.monotonic() + CLOSE_JOIN_S
        for version in to_close:
            for pool in version.pools.values():
                pool.join(max(0.0, deadline - time.monotonic()))

    # -- what clients see ---------------------------------------------------------------------------

    def status(self, name: str) -> ModelStatus:
        """The stored state, and what happened since: a fallback, devices the watchdog took out."""
        stored = self._status[name]
        version = self._versions.get(name)
        if stored.state not in SERVING or version is None:
            return stored
        state, notes = stored.state, [stored.error] if stored.error else []
        for key, fallback in version.fallbacks.items():
            notes.append(f"{key} requested, serving on {fallback.backend}: {fallback.reason}")
            state = "degraded"
        for backend, pool in version.pools.items():
            sick = pool.unhealthy
            if sick:
                notes.append(f"{backend}: " + "; ".join(f"{m.device or 'interpreter'} {m.problem}" for m in sick))
                if len(sick) == len(pool.members):
                    state = "unhealthy"
            lost = getattr(pool.engine, "problem", None)  # a pipeline with a segment lost (app/pipeline.py)
            if lost:
                notes.append(f"{backend}: {lost}")
                state = "unhealthy"
        return ModelStatus(state, "; ".join(notes) or None, stored.since)

    def status_or_raise(self, name: str) -> ModelStatus:
        if name not in self._status:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        return self.status(name)

    def ready(self) -> bool:
        """Every model serving (ready, or degraded but answering)."""
        return bool(self._status) and all(self.status(name).state in SERVING for name in self._status)

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

    def members(self, backend: str) -> list[tuple[str, Member]]:
        """(model, member) for every interpreter of `backend` serving now, for device reports."""
        return [(name, member) for name, version in self._versions.items()
                if backend in version.pools for member in version.pools[backend].members]

    def report(self, backend: str):
        """What the plug-in says about itself and its devices (GET /v1/devices); None if that
        plug-in is not available here."""
        plugin = self.plugins.get(backend)
        return None if plugin is None else plugin.report(self.members(backend))

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

    # -- loading --------------------------------------------------------------------------------------

    def _load(self, name: str, warm_up: bool, number: int) -> ModelVersion:
        model_dir = self._dirs[name]
        pools: dict[str, EnginePool] = {}
        quantizers: dict[str, InputQuantizer] = {}
        try:
            for key in self.settings.backends:
                fallback = self._fallbacks.get(name, {}).get(key)
                if fallback is None:
                    try:
                        self._add_pool(pools, quantizers, model_dir, self.plugins[key], warm_up)
                        continue
                    except ServeError as e:
                        fallback = self.plugins[key].fall_back(name, e)
                        if fallback is None:
                            raise
                        self._record_fallback(name, key, fallback)
                self._add_pool(pools, quantizers, model_dir, self.plugins[fallback.backend], warm_up)
        except BaseException:
            for pool in pools.values():  # the interpreters that did open are released, not leaked
                pool.close()
            raise
        return ModelVersion(model_dir, pools, quantizers, dict(self._fallbacks.get(name, {})), number)

    def _load_member(self, plugin: Backend, path: Path, options: EngineOptions) -> Member:
        start = time.perf_counter()
        engine = plugin.load(path, options)
        return Member(engine, (time.perf_counter() - start) * 1000, device=plugin.device(options), options=options)

    def _recreate(self, plugin: Backend, path: Path, member: Member) -> Member:
        """For the watchdog: the same interpreter again (a new delegate), on the same device."""
        return self._load_member(plugin, path, plugin.reopen(member.options))

    def _add_pool(self, pools: dict, quantizers: dict, model_dir: ModelDir, plugin: Backend, warm_up: bool) -> None:
        key = plugin.key
        if key in pools:
            return
        # a segmented model: lanes into a pipeline, segment i on device i, which watches its own stages
        segmented = model_dir.manifest.segments is not None
        members = pipeline_members(plugin, model_dir, self.settings) if segmented else []
        path = None if segmented else model_dir.file(plugin.model_file)
        try:
            for options in [] if segmented else plugin.interpreters():
                members.append(self._load_member(plugin, path, options))
        except ServeError:
            for member in members:  # the devices that did open are released, not leaked
                member.engine.close()
            raise
        watchdog = None
        if key in self.settings.watchdog_backends and not segmented:
            watchdog = Watchdog(self.settings.watchdog_timeout_s,
                                lambda member: self._recreate(plugin, path, member), self.settings.watchdog_retry_s)
        pool = EnginePool(f"{model_dir.name}/{key}", members, self.settings.max_waiting,
                          self.settings.wait_timeout_s, self.settings.retry_after_s, watchdog,
                          invoke_timeout_s=self.settings.invoke_timeout_s, max_queue_ms=self.settings.max_queue_ms,
                          thread_nice=self.settings.compute_nice if plugin.host_cpu else 0)
        try:
            spec = pool.engine.input
            _check_input_shape(model_dir, spec.shape)
            quantizer = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
            if warm_up:
                pool.warm_up()
        except BaseException:
            pool.close()
            raise
        quantizers[key] = quantizer
        pools[key] = pool
        log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                 model_dir.name, key, len(members), pool.load_ms, _fmt(pool.first_inference_ms))


def _check_input_shape(model_dir: ModelDir, shape: tuple[int, ...]) -> None:
    spec = model_dir.manifest.input
    expected = (1, spec.height, spec.width, spec.channels)
    if tuple(shape) != expected:
        raise ModelDirError(
            f"model {model_dir.name!r}: model.json describes input {expected}, the model file has {tuple(shape)}"
        )


def iso_time(unix: float | None) -> str | None:
    """UTC, to the second, for clients: when a state began, when a version loaded."""
    return None if unix is None else _iso(unix)


def _iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
