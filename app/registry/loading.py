"""Building a model version: its task, and for each configured backend a pool of loaded members.

`Loader.load_version()` is the one place versions are built, at start and on reload. A backend that
cannot serve the model (an operator it lacks, no file it runs, no TPU) is its plug-in's to decide
(Backend.fall_back): another backend serves the model instead, or none does and the model is degraded
on that backend only; the version carries what was decided (ModelVersion.fallbacks, one line each), and
the load fails only when no backend serves the model, or where the plug-in's policy says so
(EDGETPU_SERVE_EDGETPU_ON_FAILURE=fail). `Loader.load_pool()` builds one backend's pool, the same way for
every kind of member: the interpreters its plug-in asks for (a whole model: one member each; a segmented
one: a pipeline, segment i on device i), the watchdog if that backend is watched, the model checked to fit
the image front door (one input, as model.json describes it, that takes float32 or quantized pixels) and
its task (the task's output roles, resolved by tensor name), the warm-up. Whatever did open is closed again
when a later step fails: no interpreter or device leaks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engines import Backend, EngineOptions, Fallback, TensorSpec
from app.errors import ModelDirError, ServeError
from app.model_dir.reading import ModelDir
from app.model_dir.reimport import stale_preprocessing
from app.pool import EnginePool, InterpreterMember, Member, Stage, Watchdog
from app.pool.pipeline import Pipeline, stage_options
from app.registry.fallbacks import public_fallback
from app.registry.versions import ModelVersion
from app.settings import Settings
from app.tasks import OutputRoles, Task

log = logging.getLogger(__name__)

# The interpreters of one member: (file, options) per stage, in pipeline order.
Layout = list[tuple[Path, EngineOptions]]


class Loader:
    def __init__(self, settings: Settings, plugins: Mapping[str, Backend], tasks: Mapping[str, Task]):
        self.settings = settings
        self.plugins = plugins
        self.tasks = tasks

    def watched(self, key: str) -> bool:
        """Whether the watchdog watches this backend's interpreters: as the settings say, else as its plug-in does."""
        if self.settings.watchdog_backends is not None:
            return key in self.settings.watchdog_backends
        return self.plugins[key].watched

    def load_version(self, model_dir: ModelDir, number: int, warm_up: bool,
                     decided: Mapping[str, Fallback]) -> ModelVersion:
        """A complete version of `model_dir` on every configured backend that serves it (or the one serving instead).

        `decided`: requested backend -> the fallback already in force (a plug-in's start check, a device gone);
        those backends are not tried. The version's `fallbacks` are those and the ones decided now. Raises the
        first backend's error when no backend serves the model, or the error a plug-in's policy fails on."""
        task = self.task_of(model_dir)
        stale = stale_preprocessing(model_dir.manifest)  # an import older than its maker's convention
        if stale is not None:
            log.warning("%s", stale)
        served: dict[str, tuple[EnginePool, OutputRoles]] = {}
        failed: dict[str, ServeError] = {}
        fallbacks = dict(decided)
        try:
            for key in self.settings.backends:
                fallback = fallbacks.get(key)
                if fallback is None:
                    error = self._try_pool(served, failed, model_dir, task, key, warm_up)
                    if error is None:
                        continue
                    fallback = fallbacks[key] = self._fall_back(key, model_dir, error)
                if fallback.backend is None:  # no backend serves it instead: the version says why
                    continue
                error = self._try_pool(served, failed, model_dir, task, fallback.backend, warm_up)
                if error is not None:  # nor does the backend that was to serve it instead
                    fallbacks[key] = public_fallback(key, Fallback(None, f"{fallback.reason}; on {fallback.backend} "
                                                                         f"instead: {error}"),
                                                     self.plugins, self.settings.model_dir)
            if failed and not served:
                raise next(iter(failed.values()))
        except BaseException:
            for pool, _ in served.values():  # the interpreters that did open are released, not leaked
                pool.close()
            raise
        return ModelVersion(model_dir, task, {k: v[0] for k, v in served.items()},
                            {k: v[1] for k, v in served.items()}, fallbacks, number)

    def _try_pool(self, served: dict, failed: dict[str, ServeError], model_dir: ModelDir, task: Task, key: str,
                  warm_up: bool) -> ServeError | None:
        """`key`'s pool for the model into `served` (once: a fallback onto a backend already loaded is that
        pool), or the error it failed with (once: a backend that failed is not tried again in this load)."""
        if key not in served and key not in failed:
            try:
                served[key] = self.load_pool(model_dir, task, self.plugins[key], warm_up)
            except ServeError as e:
                log.warning("model %s cannot be served on %s: %s", model_dir.name, key, e)
                failed[key] = e
        return failed.get(key)

    def _fall_back(self, key: str, model_dir: ModelDir, error: ServeError) -> Fallback:
        """What `key`'s plug-in decides for a model its interpreters failed to load, as clients see it; the
        error itself where its policy is that the model fails."""
        fallback = self.plugins[key].fall_back(model_dir.name, error)
        if fallback is None:
            raise error
        return public_fallback(key, fallback, self.plugins, self.settings.model_dir)

    def task_of(self, model_dir: ModelDir) -> Task:
        task = self.tasks.get(model_dir.manifest.task)
        if task is None:
            raise ModelDirError(f"model {model_dir.name!r}: model.json says task {model_dir.manifest.task!r}, which "
                                f"this service has no task module for; known tasks: {sorted(self.tasks)}")
        return task

    def load_pool(self, model_dir: ModelDir, task: Task, plugin: Backend,
                  warm_up: bool) -> tuple[EnginePool, OutputRoles]:
        """One backend's pool for a model and the task's output roles (blocking)."""
        key, settings = plugin.key, self.settings
        members: list[Member] = []
        try:
            for layout in layouts(plugin, model_dir):
                members.append(self.load_member(plugin, model_dir, layout))
            image_input(model_dir, members[0].inputs)
            roles = task.bind(model_dir, members[0].outputs)
        except BaseException:
            for member in members:  # the devices that did open are released, not leaked
                member.close()
            raise
        watchdog = None
        if self.watched(key):
            watchdog = Watchdog(settings.watchdog_timeout_s, Reopener(self, plugin), settings.watchdog_retry_s)
        pool = EnginePool(f"{model_dir.name}/{key}", members, settings.max_waiting, settings.wait_timeout_s,
                          settings.retry_after_s, watchdog, invoke_timeout_s=settings.invoke_timeout_s,
                          max_queue_ms=settings.max_queue_ms, overload_hold_s=settings.overload_hold_s,
                          thread_nice=settings.compute_nice if plugin.host_cpu else 0, backend=key)
        try:
            if warm_up:
                pool.warm_up()
        except BaseException:
            pool.close()
            raise
        loaded = pool.members
        log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                 model_dir.name, key, loaded.interpreters, loaded.load_ms, _fmt(loaded.first_inference_ms))
        return pool, roles

    def load_member(self, plugin: Backend, model_dir: ModelDir, layout: Layout) -> Member:
        """One member: an interpreter of the whole model, or a pipeline of one interpreter per segment."""
        stages: list[Stage] = []
        try:
            for index, (path, options) in enumerate(layout):
                stages.append(self.load_stage(plugin, path, options, index))
            if len(stages) == 1:
                return InterpreterMember(stages[0])
            settings = self.settings
            return Pipeline(f"{model_dir.name}/{plugin.key}", stages, metric_labels=(model_dir.name, plugin.key),
                            lanes_per_segment=settings.pipeline_lanes_per_segment,
                            queue_depth=settings.pipeline_queue_depth,
                            thread_nice=settings.compute_nice if plugin.host_cpu else 0,
                            retry_after_s=settings.retry_after_s)
        except BaseException:
            for stage in stages:
                stage.engine.close()
            raise

    def load_stage(self, plugin: Backend, path: Path, options: EngineOptions, index: int = 0) -> Stage:
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
        return Stage(engine, (time.perf_counter() - start) * 1000, plugin.device(options), options, path, index)

    def _explain(self, key: str, path: Path, error: ServeError) -> ServeError | None:
        for plugin in self.plugins.values():
            better = plugin.explain_load_error(key, path, error)
            if better is not None:
                return better
        return None


@dataclass(frozen=True)
class Reopener:
    """Loads a lost stage again: the same interpreter (a new delegate) on the same device. What the watchdog
    re-creates a hung member with, and the device follower one whose device is back (Member.renew)."""

    loader: Loader
    plugin: Backend

    def __call__(self, stage: Stage) -> Stage:
        return self.loader.load_stage(self.plugin, stage.path, self.plugin.reopen(stage.options), stage.index)


def layouts(plugin: Backend, model_dir: ModelDir) -> list[Layout]:
    """The interpreters of each member of a pool: a whole model, one member per interpreter the plug-in
    asks for; a model cut into segments (model.json `segments`), one pipeline, segment i on device i."""
    if model_dir.manifest.segments is None:
        path = model_dir.file(plugin.model_file)
        return [[(path, options)] for options in plugin.interpreters()]
    paths = model_dir.segment_files(plugin.model_file)
    return [list(zip(paths, stage_options(plugin, len(paths))))]


def image_input(model_dir: ModelDir, inputs: Sequence[TensorSpec]) -> TensorSpec:
    """The model's one input, which an image fills: exactly one, of the shape model.json describes, float32,
    an integer tensor with a quantization scale (the pixels are quantized into it: app/imaging/quantization.py
    InputQuantizer), or an 8-bit one without quantization that takes the values themselves (MoveNet's)."""
    if len(inputs) != 1:
        raise ModelDirError(f"model {model_dir.name!r} has {len(inputs)} input tensors {[s.name for s in inputs]}; "
                            "the service feeds one image, so a model must have exactly one input")
    check_input_shape(model_dir, inputs[0].shape)
    image = inputs[0]
    integer = np.issubdtype(image.dtype, np.integer)
    if image.dtype != np.float32 and not (integer and (image.scale > 0 or image.dtype.itemsize == 1)):
        raise ModelDirError(f"model {model_dir.name!r}: its input tensor {image.name!r} is {image.dtype.name} with "
                            f"scale {image.scale}; an image goes in as float32, quantized into an integer tensor "
                            "with a positive scale, or as the values themselves into an 8-bit one")
    return image


def check_input_shape(model_dir: ModelDir, shape: tuple[int, ...]) -> None:
    spec = model_dir.manifest.input
    expected = (1, spec.height, spec.width, spec.channels)
    if tuple(shape) != expected:
        raise ModelDirError(
            f"model {model_dir.name!r}: model.json describes input {expected}, the model file has {tuple(shape)}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
