"""Each model's lifetime: its state, the version serving it now, swapped in whole, and the requests holding it.

A load or reload builds a complete new version (app/registry/loading.py) and swaps it in under one lock;
the version it replaces is retired, and closed when its last request ends: a request holds the version current
when it starts (`hold`, by its ticket: app/registry/tickets.py) until it lets go (`let_go`), counted under the
same lock, and a drain waits until none does (`wait_idle`).
Loads and reloads of one model are serialized by its reload lock, which the caller holds. A reload that
fails leaves the version before it serving and the model "degraded", with the reason and when; a model
with no version that fails to load is "failed". A reload asked for by a client tries again the backends
whose plug-in can serve the model now (Fallbacks.rechecked): a fixed file, or a device back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from app import metrics
from app.engines import Fallback
from app.errors import ModelNotFound, NotReady, ServeError, ShuttingDown
from app.model_dir.reading import ModelDir, read_model_dir
from app.registry.fallbacks import Fallbacks
from app.registry.loading import Loader
from app.registry.status import ModelStatus, iso, public_text
from app.registry.versions import ModelVersion
from app.settings import Settings

log = logging.getLogger(__name__)


class Lifetimes:
    """The configured models: each one's directory, stored state, current version and reload lock."""

    def __init__(self, settings: Settings, loader: Loader, fallbacks: Fallbacks):
        self.settings = settings
        self.loader = loader
        self.fallbacks = fallbacks
        self.lock = threading.Lock()  # the versions and states, and the requests holding versions
        self.idle = threading.Condition(self.lock)  # notified when the last request holding a version ends (draining)
        self.versions: dict[str, ModelVersion] = {}
        self.states: dict[str, ModelStatus] = {}
        self.paths: dict[str, Path] = {}
        self.dirs: dict[str, ModelDir] = {}  # as last read: at start, or by the last load
        self.reload_locks: dict[str, threading.Lock] = {}
        self.draining = False  # shutting down: nothing new is swapped in, and no version is held any more
        self.loaded = threading.Event()  # load_each has finished (each model ready or failed)
        self.active = 0  # requests holding a version now

    # -- the requests holding versions -------------------------------------------------------------

    def hold(self, name: str) -> ModelVersion:
        """The version serving `name` now, held until `let_go`: a reload meanwhile retires it but never closes it
        under the request. ShuttingDown while draining; ModelNotFound or NotReady when none serves."""
        with self.lock:
            if self.draining:
                raise ShuttingDown("the service is shutting down")
            version = self.versions.get(name)
            if version is None:
                raise self.not_serving(name)
            version.holders += 1
            self.active += 1
            return version

    def let_go(self, version: ModelVersion) -> None:
        """A request holding `version` ended: the version closes if it was retired and this was its last."""
        with self.lock:
            version.holders -= 1
            self.active -= 1
            close = version.retired and version.holders == 0
            if self.active == 0 and self.draining:  # only a drain waits for it
                self.idle.notify_all()
        if close:
            version.close()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no request holds a version, at most timeout_s (a drain: draining is set)."""
        with self.idle:
            return self.idle.wait_for(lambda: self.active == 0, timeout_s)

    def not_serving(self, name: str) -> ServeError:
        """Why no version of `name` serves: not a model here, or its state (loading, failed)."""
        status = self.states.get(name)
        if status is None:
            return ModelNotFound(f"no model {name!r}; serving {sorted(self.paths)}")
        detail = f": {status.error}" if status.error else ""
        return NotReady(f"model {name!r} is {status.state}{detail}")

    # -- loading and reloading ---------------------------------------------------------------------

    def add(self, models: Mapping[str, tuple[Path, ModelDir]]) -> None:
        """The models to serve (app/registry/startup.py find_models), each loading from now on."""
        for name, (path, model_dir) in models.items():
            self.paths[name] = path
            self.dirs[name] = model_dir
            metrics.note_task(name, model_dir.manifest.task)
            self.states[name] = ModelStatus("loading", since=time.time())
            self.reload_locks[name] = threading.Lock()

    def load_each(self, warm_up: bool) -> None:
        """Load every model that has no version yet, in turn; one that fails is "failed", the others load on."""
        try:
            for name in self.paths:
                with self.reload_locks[name]:  # a reload asked for meanwhile comes after, never under
                    if name not in self.versions:
                        self._load_first(name, warm_up)
        finally:
            self.loaded.set()

    def _load_first(self, name: str, warm_up: bool) -> None:
        try:
            version = self._build(name, warm_up, 1, self.fallbacks.of(name))
        except ServeError as e:
            metrics.model_loaded(name, ok=False)
            log.error("model %s failed to load: %s", name, e)
            with self.lock:
                self.states[name] = ModelStatus("failed", self.public(str(e)), time.time())
            return
        with self.lock:
            if self.draining:  # shut down while loading: nothing will serve it
                version.close()
                return
            self.versions[name] = version
            self.states[name] = ModelStatus("ready", since=time.time())
        self.fallbacks.keep(name, version.fallbacks)
        metrics.model_loaded(name, ok=True)

    def reload(self, name: str, warm_up: bool, decided: Mapping[str, Fallback] | None = None,
               recheck: bool = False) -> ModelVersion:
        """The model read again from disk (files re-checked), loaded, swapped in; its reload lock held. Also the
        move between a fallback and a backend, warmed up first. `decided`: the fallbacks to load with (default:
        those in force; `recheck`: those that still hold). On failure the version before serves on."""
        current = self.versions.get(name)
        try:
            self.dirs[name] = read_model_dir(self.paths[name])
            metrics.note_task(name, self.dirs[name].manifest.task)
            if decided is None:
                decided = self.fallbacks.rechecked(name, self.dirs[name]) if recheck else self.fallbacks.of(name)
            fresh = self._build(name, warm_up, (current.number + 1) if current else 1, decided)
        except ServeError as e:
            self._reload_failed(name, e)
            raise
        metrics.model_loaded(name, ok=True)
        with self.lock:
            if self.draining:
                fresh.close()
                raise ShuttingDown("the service is shutting down: reload refused")
            old = self.versions.get(name)
            self.versions[name] = fresh
            self.states[name] = ModelStatus("ready", since=time.time())
            close_old = old is not None and self.retire(old)
        self.fallbacks.keep(name, fresh.fallbacks)
        if close_old:
            old.close()
        log.info("model %s: version %d serving%s", name, fresh.number,
                 f", version {old.number} retired" if old else "")
        return fresh

    def _reload_failed(self, name: str, error: ServeError) -> None:
        metrics.model_loaded(name, ok=False)
        log.error("reload of %s failed: %s", name, error)
        if error.args and isinstance(error.args[0], str):  # redacted in place, now that it is logged in full
            error.args = (self.public(error.args[0]), *error.args[1:])
        with self.lock:
            current = self.versions.get(name)
            if current is None:
                self.states[name] = ModelStatus("failed", str(error), time.time())
            else:
                self.states[name] = ModelStatus(
                    "degraded", f"reload failed: {error}; still serving version {current.number} loaded at "
                    f"{iso(current.loaded_at)}", time.time())

    def _build(self, name: str, warm_up: bool, number: int, decided: Mapping[str, Fallback]) -> ModelVersion:
        return self.loader.load_version(self.dirs[name], number, warm_up, decided)

    def retire(self, version: ModelVersion) -> bool:
        """Under the lock: mark retired; True if no request holds it (close it now)."""
        version.retired = True
        return version.holders == 0

    def model_dir(self, name: str) -> ModelDir:
        """The model directory as last read (from the serving version, or at start)."""
        version = self.versions.get(name)
        return version.model_dir if version else self.dirs[name]

    def public(self, text: str) -> str:
        """File names relative to the model directory: clients never see the host's paths."""
        return public_text(text, self.settings.model_dir)
