"""Which models are served, on which backends, and whether they are ready.

Each model directory is read and its files checked against their sha256 at load.
A load or reload builds a complete new LoadedModel and swaps it in with one
assignment, so a request sees either the old model or the new one, never a mix.

The edgetpu backend is checked at start (library, versions, devices, compiled models):
with EDGETPU_ON_FAILURE=fail a problem stops the service; with fallback the model is
served on `cpu` instead, and /readyz and /v1/models say so and why.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app import metrics
from app.edgetpu.access import custom_op_message, is_custom_op_error
from app.engines import ENGINES, EngineOptions
from app.errors import (
    BackendNotAvailable,
    EdgeTpuUnavailable,
    EngineLoadError,
    ModelDirError,
    ModelNotFound,
    NotReady,
    ServeError,
)
from app.imaging import InputQuantizer
from app.model_dir import ModelDir, discover, read_model_dir
from app.pool import EnginePool, Member, Watchdog
from app.settings import Settings

log = logging.getLogger(__name__)

CPU = "cpu"
EDGETPU = "edgetpu"


@dataclass
class LoadedModel:
    model_dir: ModelDir
    pools: dict[str, EnginePool]
    quantizers: dict[str, InputQuantizer]
    loaded_at: float = field(default_factory=time.time)
    fallback: str | None = None  # why edgetpu was requested and cpu serves instead

    @property
    def name(self) -> str:
        return self.model_dir.name

    def pool(self, backend: str) -> EnginePool:
        try:
            return self.pools[backend]
        except KeyError:
            if backend == EDGETPU and self.fallback:
                raise BackendNotAvailable(
                    f"model {self.name!r} is served on {CPU!r} instead of {EDGETPU!r} "
                    f"(EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback): {self.fallback}; ask with backend={CPU}"
                ) from None
            raise BackendNotAvailable(
                f"backend {backend!r} is not loaded for model {self.name!r}; loaded: {sorted(self.pools)}"
            ) from None


@dataclass
class ModelStatus:
    state: str  # loading | ready | failed
    error: str | None = None


class Registry:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._models: dict[str, LoadedModel] = {}
        self._status: dict[str, ModelStatus] = {}
        self._paths: dict[str, Path] = {}
        self._reload_lock = threading.Lock()
        self.edgetpu = None  # app.edgetpu.environment.EdgeTpuEnvironment, once checked
        self._fallback: dict[str, str] = {}  # model -> why it is on cpu instead of edgetpu
        for backend in settings.backends:
            if backend not in ENGINES:
                raise ServeError(f"unknown backend {backend!r} in settings; available: {sorted(ENGINES)}")

    @property
    def default_backend(self) -> str:
        first = self.settings.backends[0]
        if first == EDGETPU and self._paths and all(name in self._fallback for name in self._paths):
            return CPU
        return first

    def configure(self) -> None:
        """Find and validate the configured model directories (fast; no interpreters yet)."""
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
            self._status[name] = ModelStatus("loading")
        if EDGETPU in self.settings.backends:
            self._check_edgetpu()

    def _check_edgetpu(self) -> None:
        """Library, version pair, devices, then each model's compiled file: fail or fall back."""
        from app.engines import edgetpu

        try:
            self.edgetpu = edgetpu.check_tpus(self.settings.edgetpu_library, self.settings.edgetpu_devices,
                                              self.settings.edgetpu_version_check)
        except EdgeTpuUnavailable as e:
            self._fall_back(list(self._paths), e)
            return
        log.info("Edge TPU: %s, pinned set %s, %d TPU(s): %s", self.edgetpu.version.describe(),
                 self.edgetpu.pinned_set.name if self.edgetpu.pinned_set else "none (version check: warn)",
                 len(self.edgetpu.targets), ", ".join(t.label for t in self.edgetpu.targets))
        for name, path in self._paths.items():
            try:
                edgetpu.check_compiled_model(read_model_dir(path), self.edgetpu)
            except (EdgeTpuUnavailable, ModelDirError) as e:
                self._fall_back([name], e)

    def _fall_back(self, names: list[str], error: ServeError) -> None:
        if self.settings.edgetpu_on_failure == "fail":
            raise error
        for name in names:
            self._fallback.setdefault(name, str(error))
        log.warning("edgetpu unavailable for %s, serving on cpu (EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback): %s",
                    ", ".join(names), error)

    def load_all(self) -> None:
        """Load (and, by setting, warm up) every configured model. Blocking: run off the event loop."""
        for name in self._paths:
            try:
                self._models[name] = self._load(name, warm_up=self.settings.warmup_at_start)
                self._status[name] = ModelStatus("ready")
                metrics.model_loaded(name, ok=True)
            except ServeError as e:
                metrics.model_loaded(name, ok=False)
                log.error("model %s failed to load: %s", name, e)
                self._status[name] = ModelStatus("failed", str(e))

    def reload(self, name: str) -> LoadedModel:
        """Load again from disk (files re-checked) without warm-up: the next request is cold."""
        if name not in self._paths:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        with self._reload_lock:
            try:
                fresh = self._load(name, warm_up=False)
            except ServeError:
                metrics.model_loaded(name, ok=False)
                raise
            metrics.model_loaded(name, ok=True)
            old = self._models.get(name)
            self._models[name] = fresh
            self._status[name] = ModelStatus("ready")
        if old is not None:
            for pool in old.pools.values():
                pool.close()
        return fresh

    def status(self, name: str) -> ModelStatus:
        """The stored state, and what happened since: a fallback, devices the watchdog took out."""
        stored = self._status[name]
        model = self._models.get(name)
        if stored.state != "ready" or model is None:
            return stored
        state, notes = "ready", []
        if model.fallback:
            notes.append(f"{EDGETPU} requested, serving on {CPU}: {model.fallback}")
        for backend, pool in model.pools.items():
            sick = pool.unhealthy
            if sick:
                notes.append(f"{backend}: " + "; ".join(f"{m.device or 'interpreter'} {m.problem}" for m in sick))
                if len(sick) == len(pool.members):
                    state = "unhealthy"
        return ModelStatus(state, "; ".join(notes) or None)

    def edgetpu_inventory(self):
        """libedgetpu, its devices and the TFLite runtime as they are now (app.engines.edgetpu.Inventory)."""
        from app.engines.edgetpu import inventory

        return inventory(self.settings.edgetpu_library)

    def edgetpu_members(self) -> list[tuple[str, Member]]:
        """(model, member) for every interpreter bound to a TPU, for device health."""
        return [(name, member) for name, model in self._models.items()
                if EDGETPU in model.pools for member in model.pools[EDGETPU].members]

    def get(self, name: str) -> LoadedModel:
        status = self._status.get(name)
        if status is None:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        model = self._models.get(name)
        if model is None:
            detail = f": {status.error}" if status.error else ""
            raise NotReady(f"model {name!r} is {status.state}{detail}")
        return model

    def names(self) -> list[str]:
        return list(self._paths)

    def status_or_raise(self, name: str) -> ModelStatus:
        if name not in self._status:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        return self.status(name)

    def ready(self) -> bool:
        return bool(self._status) and all(self.status(name).state == "ready" for name in self._status)

    def close(self) -> None:
        for model in self._models.values():
            for pool in model.pools.values():
                pool.close()

    def _load(self, name: str, warm_up: bool) -> LoadedModel:
        model_dir = read_model_dir(self._paths[name])
        pools, quantizers = {}, {}
        for backend in self.settings.backends:
            try:
                self._add_pool(pools, quantizers, model_dir, self._serving(name, backend), warm_up)
            except EdgeTpuUnavailable as e:  # a delegate that would not open: the policy decides
                if backend != EDGETPU:
                    raise
                self._fall_back([name], e)
                self._add_pool(pools, quantizers, model_dir, CPU, warm_up)
        return LoadedModel(model_dir, pools, quantizers, fallback=self._fallback.get(name))

    def _serving(self, name: str, backend: str) -> str:
        return CPU if backend == EDGETPU and name in self._fallback else backend

    def _engine_options(self, backend: str) -> list[EngineOptions]:
        """One entry per interpreter: per TPU for edgetpu, `workers` of them otherwise."""
        if backend == EDGETPU:
            from app.engines.edgetpu import tpu_options

            return tpu_options(self.edgetpu, self.settings.cpu_threads, self.settings.edgetpu_performance)
        return [EngineOptions(cpu_threads=self.settings.cpu_threads)] * self.settings.workers

    def _load_member(self, backend: str, path: Path, options: EngineOptions) -> Member:
        start = time.perf_counter()
        try:
            engine = ENGINES[backend].load(path, options)
        except EngineLoadError as e:
            if is_custom_op_error(str(e)) and not isinstance(e, EdgeTpuUnavailable):
                raise ModelDirError(custom_op_message(path, backend)) from None
            raise
        tpu = getattr(options, "tpu", None)
        return Member(engine, (time.perf_counter() - start) * 1000, device=tpu.path if tpu else None,
                      options=options)

    def _recreate(self, backend: str, path: Path, member: Member) -> Member:
        """For the watchdog: the same interpreter again (a new delegate), on the same device."""
        options = member.options
        if backend == EDGETPU:
            from app.engines.edgetpu import reopen_options

            options = reopen_options(options, self.edgetpu)
        return self._load_member(backend, path, options)

    def _add_pool(self, pools: dict, quantizers: dict, model_dir: ModelDir, backend: str, warm_up: bool) -> None:
        if backend in pools:
            return
        path = model_dir.file(ENGINES[backend].model_file)
        members = []
        try:
            for options in self._engine_options(backend):
                members.append(self._load_member(backend, path, options))
        except ServeError:
            for member in members:  # the TPUs that did open are released, not leaked
                member.engine.close()
            raise
        watchdog = None
        if backend in self.settings.watchdog_backends:
            watchdog = Watchdog(self.settings.watchdog_timeout_s,
                                lambda member: self._recreate(backend, path, member), self.settings.watchdog_retry_s)
        pool = EnginePool(f"{model_dir.name}/{backend}", members, self.settings.max_waiting,
                          self.settings.wait_timeout_s, self.settings.retry_after_s, watchdog)
        spec = pool.engine.input
        quantizers[backend] = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
        _check_input_shape(model_dir, spec.shape)
        if warm_up:
            pool.warm_up()
        pools[backend] = pool
        log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                 model_dir.name, backend, len(members), pool.load_ms, _fmt(pool.first_inference_ms))


def _check_input_shape(model_dir: ModelDir, shape: tuple[int, ...]) -> None:
    spec = model_dir.manifest.input
    expected = (1, spec.height, spec.width, spec.channels)
    if tuple(shape) != expected:
        raise ModelDirError(
            f"model {model_dir.name!r}: model.json describes input {expected}, the model file has {tuple(shape)}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
