"""Which models are served, on which backends, and whether they are ready.

Each model directory is read and its files checked against their sha256 at load.
A load or reload builds a complete new LoadedModel and swaps it in with one
assignment, so a request sees either the old model or the new one, never a mix.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.engines import ENGINES, EngineOptions
from app.errors import BackendNotAvailable, ModelDirError, ModelNotFound, NotReady, ServeError
from app.imaging import InputQuantizer
from app.model_dir import ModelDir, discover, read_model_dir
from app.pool import EnginePool, Member
from app.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model_dir: ModelDir
    pools: dict[str, EnginePool]
    quantizers: dict[str, InputQuantizer]
    loaded_at: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.model_dir.name

    def pool(self, backend: str) -> EnginePool:
        try:
            return self.pools[backend]
        except KeyError:
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
        for backend in settings.backends:
            if backend not in ENGINES:
                raise ServeError(f"unknown backend {backend!r} in settings; available: {sorted(ENGINES)}")

    @property
    def default_backend(self) -> str:
        return self.settings.backends[0]

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

    def load_all(self) -> None:
        """Load (and, by setting, warm up) every configured model. Blocking: run off the event loop."""
        for name in self._paths:
            try:
                self._models[name] = self._load(name, warm_up=self.settings.warmup_at_start)
                self._status[name] = ModelStatus("ready")
            except ServeError as e:
                log.error("model %s failed to load: %s", name, e)
                self._status[name] = ModelStatus("failed", str(e))

    def reload(self, name: str) -> LoadedModel:
        """Load again from disk (files re-checked) without warm-up: the next request is cold."""
        if name not in self._paths:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        with self._reload_lock:
            fresh = self._load(name, warm_up=False)
            old = self._models.get(name)
            self._models[name] = fresh
            self._status[name] = ModelStatus("ready")
        if old is not None:
            for pool in old.pools.values():
                pool.close()
        return fresh

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

    def status(self, name: str) -> ModelStatus:
        return self._status[name]

    def status_or_raise(self, name: str) -> ModelStatus:
        if name not in self._status:
            raise ModelNotFound(f"no model {name!r}; serving {sorted(self._paths)}")
        return self._status[name]

    def ready(self) -> bool:
        return bool(self._status) and all(s.state == "ready" for s in self._status.values())

    def close(self) -> None:
        for model in self._models.values():
            for pool in model.pools.values():
                pool.close()

    def _load(self, name: str, warm_up: bool) -> LoadedModel:
        model_dir = read_model_dir(self._paths[name])
        options = EngineOptions(cpu_threads=self.settings.cpu_threads)
        pools, quantizers = {}, {}
        for backend in self.settings.backends:
            engine_cls = ENGINES[backend]
            path = model_dir.file(engine_cls.model_file)
            members = []
            for _ in range(self.settings.workers):
                start = time.perf_counter()
                engine = engine_cls.load(path, options)
                members.append(Member(engine, (time.perf_counter() - start) * 1000))
            pool = EnginePool(f"{name}/{backend}", members, self.settings.max_waiting,
                              self.settings.wait_timeout_s, self.settings.retry_after_s)
            spec = pool.engine.input
            quantizers[backend] = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
            _check_input_shape(model_dir, spec.shape)
            if warm_up:
                pool.warm_up()
            pools[backend] = pool
            log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                     name, backend, len(members), pool.load_ms, _fmt(pool.first_inference_ms))
        return LoadedModel(model_dir, pools, quantizers)


def _check_input_shape(model_dir: ModelDir, shape: tuple[int, ...]) -> None:
    spec = model_dir.manifest.input
    expected = (1, spec.height, spec.width, spec.channels)
    if tuple(shape) != expected:
        raise ModelDirError(
            f"model {model_dir.name!r}: model.json describes input {expected}, the model file has {tuple(shape)}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
