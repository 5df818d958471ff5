"""Building a model version: for each configured backend, a pool of loaded interpreters.

`Loader.load_version()` is the one place versions are built, at start and on reload; a backend
that cannot serve the model hands it to the backend its plug-in names (a fallback), when its
policy allows. `Loader.load_pool()` builds one backend's pool: the interpreters its plug-in asks
for, the watchdog if that backend is watched, the input checked against model.json, the warm-up.
Whatever did open is closed again when a later step fails: no interpreter or device leaks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from app.engines import Backend, EngineOptions, Fallback
from app.errors import ModelDirError, ServeError
from app.imaging import InputQuantizer
from app.model_dir import ModelDir
from app.pipeline import pipeline_members
from app.pool import EnginePool, Member, Watchdog
from app.registry.versions import ModelVersion
from app.settings import Settings

log = logging.getLogger(__name__)


class Loader:
    def __init__(self, settings: Settings, plugins: Mapping[str, Backend], watched: Callable[[str], bool]):
        self.settings = settings
        self.plugins = plugins
        self.watched = watched  # whether a backend's interpreters are watched (the registry decides)

    def load_version(self, model_dir: ModelDir, number: int, warm_up: bool, fallbacks: Mapping[str, Fallback],
                     fell_back: Callable[[str, Fallback], Fallback]) -> ModelVersion:
        """A complete version of `model_dir` on every configured backend (or the one serving instead).

        `fallbacks`: requested backend -> the fallback already decided (at start); `fell_back(key,
        fallback)` records one decided now, when a backend's interpreters fail to load and its plug-in's
        policy hands the model on, and gives it back as recorded. Raises the first ServeError no
        fallback covers."""
        pools: dict[str, EnginePool] = {}
        quantizers: dict[str, InputQuantizer] = {}
        decided = dict(fallbacks)
        try:
            for key in self.settings.backends:
                fallback = decided.get(key)
                if fallback is None:
                    try:
                        self._add_pool(pools, quantizers, model_dir, self.plugins[key], warm_up)
                        continue
                    except ServeError as e:
                        fallback = self.plugins[key].fall_back(model_dir.name, e)
                        if fallback is None:
                            raise
                        fallback = decided[key] = fell_back(key, fallback)
                if fallback.backend is None:  # no backend serves it instead: the version says why
                    continue
                self._add_pool(pools, quantizers, model_dir, self.plugins[fallback.backend], warm_up)
        except BaseException:
            for pool in pools.values():  # the interpreters that did open are released, not leaked
                pool.close()
            raise
        return ModelVersion(model_dir, pools, quantizers, decided, number)

    def _add_pool(self, pools: dict, quantizers: dict, model_dir: ModelDir, plugin: Backend, warm_up: bool) -> None:
        if plugin.key in pools:  # a fallback onto a backend already loaded
            return
        pools[plugin.key], quantizers[plugin.key] = self.load_pool(model_dir, plugin, warm_up)

    def load_pool(self, model_dir: ModelDir, plugin: Backend, warm_up: bool) -> tuple[EnginePool, InputQuantizer]:
        """One backend's pool for a model, and the quantizer of its input (blocking)."""
        key = plugin.key
        # a segmented model: lanes into a pipeline, segment i on device i, which watches its own stages
        segmented = model_dir.manifest.segments is not None
        members = pipeline_members(plugin, model_dir, self.settings, self.watched(key)) if segmented else []
        path = None if segmented else model_dir.file(plugin.model_file)
        try:
            for options in [] if segmented else plugin.interpreters():
                members.append(self.load_member(plugin, path, options))
        except ServeError:
            for member in members:  # the devices that did open are released, not leaked
                member.engine.close()
            raise
        watchdog = None
        if self.watched(key) and not segmented:
            watchdog = Watchdog(self.settings.watchdog_timeout_s,
                                lambda member: self.recreate(plugin, path, member), self.settings.watchdog_retry_s)
        settings = self.settings
        pool = EnginePool(f"{model_dir.name}/{key}", members, settings.max_waiting, settings.wait_timeout_s,
                          settings.retry_after_s, watchdog, invoke_timeout_s=settings.invoke_timeout_s,
                          max_queue_ms=settings.max_queue_ms,
                          thread_nice=settings.compute_nice if plugin.host_cpu else 0)
        try:
            spec = pool.engine.input
            check_input_shape(model_dir, spec.shape)
            quantizer = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
            if warm_up:
                pool.warm_up()
        except BaseException:
            pool.close()
            raise
        log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                 model_dir.name, key, len(members), pool.load_ms, _fmt(pool.first_inference_ms))
        return pool, quantizer

    def load_member(self, plugin: Backend, path: Path, options: EngineOptions) -> Member:
        """One interpreter, timed; a failure another plug-in recognises (a file made for its device, say)
        is explained by that plug-in."""
        start = time.perf_counter()
        try:
            engine = plugin.load(path, options)
        except ServeError as e:
            better = self._explain(plugin.key, path, e)
            if better is None:
                raise
            raise better from None
        return Member(engine, (time.perf_counter() - start) * 1000, device=plugin.device(options), options=options)

    def recreate(self, plugin: Backend, path: Path, member: Member) -> Member:
        """For the watchdog: the same interpreter again (a new delegate), on the same device."""
        return self.load_member(plugin, path, plugin.reopen(member.options))

    def _explain(self, key: str, path: Path, error: ServeError) -> ServeError | None:
        for plugin in self.plugins.values():
            better = plugin.explain_load_error(key, path, error)
            if better is not None:
                return better
        return None


def check_input_shape(model_dir: ModelDir, shape: tuple[int, ...]) -> None:
    spec = model_dir.manifest.input
    expected = (1, spec.height, spec.width, spec.channels)
    if tuple(shape) != expected:
        raise ModelDirError(
            f"model {model_dir.name!r}: model.json describes input {expected}, the model file has {tuple(shape)}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
