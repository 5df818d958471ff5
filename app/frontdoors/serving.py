"""The service's detection models as the ZMQ door sees them (zmq_door.Detectors), through the core (app/core).

`rows()` holds the model through the core (its version, the room check, a place in line) and runs the tensor as it
came (`TensorInput`: checked against the model's input tensor, never decoded). An SSD (its outputs
TFLite_Detection_PostProcess's four) is read as Frigate's own Coral detector reads it: the task's named tensors
(each role's tensor as the model gave it, found by name) through Frigate's SSD rule (frigate.ssd_rows), so the rows
are Frigate's to the bit, boxes unclipped. Any other detector family the detection task reads is answered from the
task's answer (its objects, best first, boxes normalized to the input), cut as Frigate's rule cuts (`detection_rows`).
Timings and cold starts are observed in /metrics as for any input.
"""

from __future__ import annotations

import asyncio

import numpy as np

from app.core import Core, TensorInput
from app.frontdoors.frigate import COLUMNS, ROWS, SSD_MIN_SCORE, ssd_rows
from app.frontdoors.served import ServedDetector
from app.model_dir.reading import ModelDir
from app.model_dir.schema import POSTPROCESS
from app.registry import ModelVersion
from app.tasks.detect import BOXES, CLASSES, COUNT, SCORES, TASK, DetectOptions, Detection

SSD = "ssd"
YOLO = "yolo"


def family(model_dir: ModelDir) -> str:
    """Frigate's family of a detection model, by its decoder (model.json `detection`): "ssd" for the outputs of
    TFLite_Detection_PostProcess, "yolo" for a YOLO head the detection task decodes (Frigate's yolo-generic)."""
    return SSD if model_dir.manifest.detection_spec().decoder == POSTPROCESS else YOLO


class CoreDetectors:
    def __init__(self, core: Core):
        self.core = core
        self.registry = core.registry
        self._seen: dict[str, tuple[ModelVersion | None, ModelDir, ServedDetector | None]] = {}

    def default(self) -> str | None:
        return self.registry.default_for(TASK.name)

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

    def detector(self, name: str) -> ServedDetector | None:
        return self._detector(name) if name in self.registry.names() else None

    def _detector(self, name: str) -> ServedDetector | None:
        registry = self.registry
        version, model_dir = registry.serving(name), registry.models.model_dir(name)
        seen = self._seen.get(name)
        if seen is not None and seen[0] is version and seen[1] is model_dir and version is not None:
            return seen[2]  # made once per version: the hot path asks for every request
        # a version serving is loaded (its devices' trouble, if any, is the run's refusal to tell); else its state
        state = "ready" if version is not None else registry.status(name).state
        detector = None
        if model_dir.manifest.task == TASK.name:
            pool = next(iter(version.pools.values()), None) if version is not None else None
            spec = model_dir.manifest.input
            shape = tuple(pool.members.inputs[0].shape) if pool else (1, spec.height, spec.width, spec.channels)
            dtype = pool.members.inputs[0].dtype if pool else np.dtype(np.uint8)
            detector = ServedDetector(name, shape, dtype, family(model_dir), file_names(model_dir),
                                      loaded=pool is not None, state=state, hashes=file_hashes(model_dir))
        self._seen[name] = (version, model_dir, detector)
        return detector

    async def rows(self, model: str, tensor: np.ndarray) -> tuple[np.ndarray, str]:
        given = TensorInput(tensor)
        async with self.core.hold(TASK, model, None) as held:
            if family(held.model_dir) == SSD:
                (ran,) = await self.core.tensors(held, [given])
                values = ran.values
                return ssd_rows(values[BOXES], values[CLASSES], values[SCORES], values[COUNT]), held.backend
            answer = await self.core.answer(held, given, DetectOptions(min_score=SSD_MIN_SCORE, max_detections=ROWS))
            return detection_rows(answer.result), answer.backend


def detection_rows(result: Detection) -> np.ndarray:
    """A detection answer of a tensor (its geometry the identity: box_normalized is the input's) as Frigate's rows:
    best first, up to the first scoring below SSD_MIN_SCORE, at most ROWS."""
    rows = np.zeros((ROWS, COLUMNS), np.float32)
    for i, found in enumerate(result.detections[:ROWS]):
        if found.score < SSD_MIN_SCORE:
            break
        box = found.box_normalized
        rows[i] = (found.class_id, found.score, box.y_min, box.x_min, box.y_max, box.x_max)
    return rows


def file_names(model_dir: ModelDir) -> frozenset[str]:
    """The names a model's files go by, in lower case (a model_request's name is matched case aside): as written in
    its directory, and as given when it was imported or uploaded."""
    names = {entry.path.rsplit("/", 1)[-1] for entry in model_dir.manifest.files.values()}
    imported = model_dir.manifest.imported
    if imported is not None:
        names |= {f.name.replace("\\", "/").rsplit("/", 1)[-1] for f in imported.files}
    return frozenset(name.lower() for name in names)


def file_hashes(model_dir: ModelDir) -> frozenset[str]:
    """The sha256 of a model's files, and of the files it was imported or uploaded from: an upload of one of them
    is this model."""
    hashes = {entry.sha256 for entry in model_dir.manifest.files.values()}
    imported = model_dir.manifest.imported
    if imported is not None:
        hashes |= {f.sha256 for f in imported.files}
    return frozenset(hashes)
