"""Models run in the converter's own process the way the service runs them: the service's backend plug-ins
(app/engines: `cpu`, TFLite's kernels; `emulated`, the numpy emulator) and its tasks (app/tasks), on images made by
its image work (app/imaging). No server, no pool: one interpreter, one input at a time.

    LocalModel.open(models / "faces", "cpu").answer(photo)   # the task's result, as /v1 would have it
    run_once(path, tensor)                                    # a file's raw outputs by tensor name (import's probe)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from app.engines import ENGINES, Engine, EngineOptions
from app.errors import ServeError
from app.imaging.decoding import Source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import ModelDir, read_model_dir
from app.tasks import TASKS, OutputRoles, Outputs, Task

BACKENDS = ("cpu", "emulated")


class LocalModelError(ServeError):
    """A model that cannot run here as asked: the message says why."""


def engine_class(backend: str) -> type[Engine]:
    """The interpreter class of a backend the converter can run (BACKENDS)."""
    if backend not in BACKENDS:
        raise LocalModelError(f"backend {backend!r}: the converter runs models on {', '.join(BACKENDS)}")
    engine = ENGINES.get(backend)
    if engine is None:
        raise LocalModelError(f"backend {backend!r} is not available here (its runtime did not import)")
    return engine


def load_engine(path: Path, backend: str) -> Engine:
    """One interpreter of the file on `backend`."""
    return engine_class(backend).load(Path(path), EngineOptions(cpu_threads=1))


def run_once(path: Path, tensor: np.ndarray, backend: str = "cpu") -> dict[str, np.ndarray]:
    """The file run once on `tensor`: its outputs as the model gives them, by tensor name."""
    engine = load_engine(path, backend)
    try:
        outputs = engine.run([tensor])
        return {spec.name: output for spec, output in zip(engine.outputs, outputs)}
    finally:
        engine.close()


@dataclass
class LocalModel:
    """A model directory on one backend with its task bound, as the registry binds it at load."""

    model_dir: ModelDir
    task: Task
    engine: Engine
    roles: OutputRoles
    quantizer: InputQuantizer

    @classmethod
    def open(cls, path: Path, backend: str = "cpu", task: str | None = None) -> LocalModel:
        """Load models/<name>/ on `backend`; `task`: the task it must be (LocalModelError otherwise)."""
        model_dir = read_model_dir(path)
        manifest = model_dir.manifest
        if task is not None and manifest.task != task:
            raise LocalModelError(f"model {model_dir.name!r} has task {manifest.task!r}; {task!r} is needed here")
        found = TASKS.get(manifest.task)
        if found is None:
            raise LocalModelError(f"model {model_dir.name!r}: no task module for {manifest.task!r}")
        if manifest.segments is not None:
            raise LocalModelError(f"model {model_dir.name!r} is segmented: run its whole model")
        engine = load_engine(model_dir.file(engine_class(backend).model_file), backend)
        try:
            roles = found.bind(model_dir, engine.outputs)
            (image,) = engine.inputs
            quantizer = InputQuantizer(manifest.input, image.dtype, image.scale, image.zero_point)
        except BaseException:
            engine.close()
            raise
        return cls(model_dir, found, engine, roles, quantizer)

    def answer(self, image: Image.Image, options: object = None):
        """The task's result for a decoded image (upright, at its full size), preprocessed as the service does."""
        spec = self.model_dir.manifest.input
        image = image.convert("L" if spec.channels == 1 else "RGB")
        tensor = self.quantizer(to_pixels(image, spec, image.size))
        geometry = Geometry.of(Source(*image.size), image.size, spec)
        outputs = self.engine.run([tensor])
        options = options if options is not None else self.task.options()
        options = self.task.ready(options, self.model_dir)
        return self.task.read(Outputs(outputs, self.roles, self.model_dir, geometry), options)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> LocalModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
