"""The service's detection models as the ZMQ door sees them (zmq_door.Detectors), on the registry.

`rows()` runs a tensor as it came (app/inference.py run_tensor: checked against the model's input tensor, never
decoded) through a lease of the model's current version, as every door does, and reads the detector's four outputs
by role (app/tasks/detect.py) with Frigate's SSD rule (app/frontdoors/frigate.py ssd_rows). Timings and cold starts
are observed in /metrics as for any input (`finish`).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from app.frontdoors.frigate import ssd_rows
from app.frontdoors.zmq_door import ServedDetector
from app.inference import finish, run_tensor
from app.model_dir.reading import ModelDir
from app.registry import ModelVersion, Registry
from app.tasks import detect

# the family of a detection model, by what its outputs are: TFLite_Detection_PostProcess's four
SSD_ROLES = frozenset(detect.TASK.roles)


class RegistryDetectors:
    def __init__(self, registry: Registry):
        self.registry = registry
        self._seen: dict[str, tuple[ModelVersion | None, ModelDir, ServedDetector | None]] = {}

    def default(self) -> str | None:
        return self.registry.settings.default_detection_model

    async def settled(self, timeout_s: float) -> None:
        if not self.registry.wait_loaded(0):
            await asyncio.to_thread(self.registry.wait_loaded, timeout_s)

    def detectors(self) -> list[ServedDetector]:
        found = []
        for name in self.registry.names():
            detector = self._detector(name)
            if detector is not None:
                found.append(detector)
        return found

    def _detector(self, name: str) -> ServedDetector | None:
        registry = self.registry
        version, model_dir = registry.serving(name), registry.model_dir(name)
        seen = self._seen.get(name)
        if seen is not None and seen[0] is version and seen[1] is model_dir and version is not None:
            return seen[2]  # made once per version: the hot path asks for every request
        # a version serving is loaded (its devices' trouble, if any, is the run's refusal to tell); else its state
        state = "ready" if version is not None else registry.status(name).state
        detector = None
        if model_dir.manifest.task == detect.TASK.name:
            pool = next(iter(version.pools.values()), None) if version is not None else None
            spec = model_dir.manifest.input
            shape = tuple(pool.inputs[0].shape) if pool else (1, spec.height, spec.width, spec.channels)
            dtype = pool.inputs[0].dtype if pool else np.dtype(np.uint8)
            family = "ssd" if set(model_dir.manifest.outputs) <= SSD_ROLES else "other"
            detector = ServedDetector(name, shape, dtype, family, file_names(model_dir),
                                      loaded=pool is not None, state=state)
        self._seen[name] = (version, model_dir, detector)
        return detector

    async def rows(self, model: str, tensor: np.ndarray) -> tuple[np.ndarray, str]:
        async with self.registry.lease(model) as lease:
            roles = lease.roles_for(detect.TASK)
            ran = await run_tensor(lease, tensor)
            start = time.perf_counter()
            outputs = ran.outputs
            rows = ssd_rows(roles.of(outputs, detect.BOXES), roles.of(outputs, detect.CLASSES),
                            roles.of(outputs, detect.SCORES), roles.of(outputs, detect.COUNT))
            finish(lease, ran, start)
            return rows, lease.backend


def file_names(model_dir: ModelDir) -> frozenset[str]:
    """The names a model's files go by: as written in its directory, and as given when it was imported or uploaded."""
    names = {entry.path.rsplit("/", 1)[-1] for entry in model_dir.manifest.files.values()}
    imported = model_dir.manifest.imported
    if imported is not None:
        names |= {f.name.rsplit("/", 1)[-1] for f in imported.files}
    return frozenset(names)
