"""Building a model version: its task, and for each configured backend a pool of loaded members.

`Loader.load_version()` is the one place versions are built, at start and on reload; a backend
that cannot serve the model hands it to the backend its plug-in names (a fallback), when its
policy allows. `Loader.load_pool()` builds one backend's pool, the same way for every kind of
member: the interpreters its plug-in asks for (a whole model: one member each; a segmented one: a
pipeline, segment i on device i), the watchdog if that backend is watched, the model checked to fit
the image front door (one input, as model.json describes it, that takes float32 or quantized pixels) and
its task (the task's output roles, resolved by tensor name), the warm-up. Whatever did open is closed again when a later step fails:
no interpreter or device leaks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from app.engines import Backend, EngineOptions, Fallback, TensorSpec
from app.errors import ModelDirError, ServeError
from app.model_dir.reading import ModelDir
from app.pool.pipeline import Pipeline, stage_options
from app.pool import EnginePool, InterpreterMember, Member, Stage, Watchdog
from app.registry.versions import ModelVersion
from app.settings import Settings
from app.tasks import OutputRoles, Task

log = logging.getLogger(__name__)

# The interpreters of one member: (file, options) per stage, in pipeline order.
Layout = list[tuple[Path, EngineOptions]]


class Loader:
    def __init__(self, settings: Settings, plugins: Mapping[str, Backend], watched: Callable[[str], bool],
                 tasks: Mapping[str, Task]):
        self.settings = settings
        self.plugins = plugins
        self.watched = watched  # whether a backend's interpreters are watched (the registry decides)
        self.tasks = tasks

    def load_version(self, model_dir: ModelDir, number: int, warm_up: bool, fallbacks: Mapping[str, Fallback],
                     fell_back: Callable[[str, Fallback], Fallback]) -> ModelVersion:
        """A complete version of `model_dir` on every configured backend (or the one serving instead).

        `fallbacks`: requested backend -> the fallback already decided (at start); `fell_back(key,
        fallback)` records one decided now, when a backend's interpreters fail to load and its plug-in's
        policy hands the model on, and gives it back as recorded. Raises the first ServeError no
        fallback covers."""
        task = self.task_of(model_dir)
        served: dict[str, tuple[EnginePool, OutputRoles]] = {}
        decided = dict(fallbacks)
        try:
            for key in self.settings.backends:
                fallback = decided.get(key)
                if fallback is None:
                    try:
                        self._add_pool(served, model_dir, task, self.plugins[key], warm_up)
                        continue
                    except ServeError as e:
                        fallback = self.plugins[key].fall_back(model_dir.name, e)
                        if fallback is None:
                            raise
                        fallback = decided[key] = fell_back(key, fallback)
                if fallback.backend is None:  # no backend serves it instead: the version says why
                    continue
                self._add_pool(served, model_dir, task, self.plugins[fallback.backend], warm_up)
        except BaseException:
            for pool, _ in served.values():  # the interpreters that did open are released, not leaked
                pool.close()
            raise
        return ModelVersion(model_dir, task, {k: v[0] for k, v in served.items()},
                            {k: v[1] for k, v in served.items()}, decided, number)

    def task_of(self, model_dir: ModelDir) -> Task:
        task = self.tasks.get(model_dir.manifest.task)
        if task is None:
            raise ModelDirError(f"model {model_dir.name!r}: model.json says task {model_dir.manifest.task!r}, which "
                                f"this service has no task module for; known tasks: {sorted(self.tasks)}")
        return task

    def _add_pool(self, served: dict, model_dir: ModelDir, task: Task, plugin: Backend, warm_up: bool) -> None:
        if plugin.key in served:  # a fallback onto a backend already loaded
            return
        served[plugin.key] = self.load_pool(model_dir, task, plugin, warm_up)

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
            watchdog = Watchdog(settings.watchdog_timeout_s, lambda stage: self.reload(plugin, stage),
                                settings.watchdog_retry_s)
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
        log.info("loaded %s on %s: %d interpreters, %.1f ms load, first inference %s ms",
                 model_dir.name, key, pool.interpreters, pool.load_ms, _fmt(pool.first_inference_ms))
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

    def reload(self, plugin: Backend, stage: Stage) -> Stage:
        """For the watchdog: the same interpreter again (a new delegate), on the same device."""
        return self.load_stage(plugin, stage.path, plugin.reopen(stage.options), stage.index)

    def _explain(self, key: str, path: Path, error: ServeError) -> ServeError | None:
        for plugin in self.plugins.values():
            better = plugin.explain_load_error(key, path, error)
            if better is not None:
                return better
        return None


def layouts(plugin: Backend, model_dir: ModelDir) -> list[Layout]:
    """The interpreters of each member of a pool: a whole model, one member per interpreter the plug-in
    asks for; a model cut into segments (model.json `segments`), one pipeline, segment i on device i."""
    if model_dir.manifest.segments is None:
        path = model_dir.file(plugin.model_file)
        return [[(path, options)] for options in plugin.interpreters()]
    paths = model_dir.segment_files(plugin.model_file)
    return [list(zip(paths, stage_options(plugin, len(paths))))]


def image_input(model_dir: ModelDir, inputs: Sequence[TensorSpec]) -> TensorSpec:
    """The model's one input, which an image fills: exactly one, of the shape model.json describes, float32 or
    an integer tensor with a quantization scale (the pixels are quantized into it: app/imaging/quantization.py InputQuantizer)."""
    if len(inputs) != 1:
        raise ModelDirError(f"model {model_dir.name!r} has {len(inputs)} input tensors {[s.name for s in inputs]}; "
                            "the service feeds one image, so a model must have exactly one input")
    check_input_shape(model_dir, inputs[0].shape)
    image = inputs[0]
    if image.dtype != np.float32 and not (np.issubdtype(image.dtype, np.integer) and image.scale > 0):
        raise ModelDirError(f"model {model_dir.name!r}: its input tensor {image.name!r} is {image.dtype.name} with "
                            f"scale {image.scale}; an image goes in as float32, or quantized into an integer tensor "
                            "with a positive scale")
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
