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

import numpy as np

from app.core import Core, ModelDescription, TensorInput
from app.frontdoors.frigate import COLUMNS, ROWS, SSD_MIN_SCORE, ssd_rows
from app.frontdoors.served import ServedDetector
from app.model_dir.schema import POSTPROCESS
from app.tasks.detect import BOXES, CLASSES, COUNT, SCORES, TASK, DetectOptions, Detection

SSD = "ssd"
YOLO = "yolo"


def family(model: ModelDescription) -> str:
    """Frigate's family of a detection model, by its decoder (model.json `detection`): "ssd" for the outputs of
    TFLite_Detection_PostProcess, "yolo" for a YOLO head the detection task decodes (Frigate's yolo-generic)."""
    return SSD if model.detection["decoder"] == POSTPROCESS else YOLO


class CoreDetectors:
    """The detection models the core serves, as the door sees them: each made once per version serving (the door
    asks for every request), from the core's description of it."""

    def __init__(self, core: Core):
        self.core = core
        self._seen: dict[str, tuple[object, ServedDetector]] = {}  # name -> (the version it was made of, it)

    def default(self) -> str | None:
        return self.core.default_model(TASK.name)

    async def settled(self, timeout_s: float) -> None:
        await self.core.settled(timeout_s)

    def detectors(self) -> list[ServedDetector]:
        return [self._detector(name) for name in self.core.models(TASK.name)]

    def detector(self, name: str) -> ServedDetector | None:
        version = self.core.serving(name)
        seen = self._seen.get(name)
        if version is not None and seen is not None and seen[0] is version:
            return seen[1]  # the hot path: one look-up, the same version
        return self._detector(name) if name in self.core.models(TASK.name) else None

    def _detector(self, name: str) -> ServedDetector:
        version = self.core.serving(name)
        seen = self._seen.get(name)
        if version is not None and seen is not None and seen[0] is version:
            return seen[1]
        model = self.core.describe(name)
        served = next(iter(model.backends.values()), None)  # the first backend serving it: the default's input
        if served is not None:
            shape, dtype = tuple(served.input.shape), np.dtype(served.input.dtype)
        else:
            spec = model.input
            shape, dtype = (1, spec["height"], spec["width"], spec["channels"]), np.dtype(np.uint8)
        # a version serving is loaded (its devices' trouble, if any, is the run's refusal to tell); else its state
        detector = ServedDetector(name, shape, dtype, family(model), file_names(model), loaded=served is not None,
                                  state="ready" if version is not None else model.state, hashes=file_hashes(model))
        if version is not None:
            self._seen[name] = (version, detector)
        return detector

    async def rows(self, model: str, tensor: np.ndarray) -> tuple[np.ndarray, str]:
        given = TensorInput(tensor)
        async with self.core.hold(TASK, model, None) as held:
            if held.model_dir.manifest.detection_spec().decoder == POSTPROCESS:
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


def file_names(model: ModelDescription) -> frozenset[str]:
    """The names a model's files go by, in lower case (a model_request's name is matched case aside): as written in
    its directory, and as given when it was imported or uploaded."""
    names = {entry.path.rsplit("/", 1)[-1] for entry in model.files.values()}
    names |= {f.name.replace("\\", "/").rsplit("/", 1)[-1] for f in model.provenance.files}
    return frozenset(name.lower() for name in names)


def file_hashes(model: ModelDescription) -> frozenset[str]:
    """The sha256 of a model's files, and of the files it was imported or uploaded from: an upload of one of them
    is this model."""
    return frozenset({entry.sha256 for entry in model.files.values()} | {f.sha256 for f in model.provenance.files})
