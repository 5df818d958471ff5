"""Which served models the face commands run: FACE_DETECTOR (a detection model) and FACE_EMBEDDER (an embedding
model), checked against what is served on every request, so that a reload or a model added later is seen and a
setting that names nothing answers what to do instead of failing the start (the rest of the service serves on).

While either is unset, names no served model, or a model of another task, every face command raises
FacesUnavailable (503) naming the setting to set and the served models that could fill it. What the face commands
need of the embedder is read from the model version a request holds (`EmbedderFacts.of(model_dir)`): its id in the
gallery (its model file's sha256), its input size, its crop margin and its calibration, so that a reload that brings
another file brings its own vectors and calibration, never the old ones'.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.faces.confidence import Calibration
from app.faces.errors import FacesUnavailable
from app.model_dir.reading import ModelDir
from app.model_dir.schema import EMBEDDING, FaceSpec
from app.settings import ENV_PREFIX, Settings

DETECTION = "detection"
HOW_TO_IMPORT = "docs/faces.md, Importing public face models"


@dataclass(frozen=True)
class FacePair:
    """The face detector and the embedder, both served."""

    detector: str
    embedder: str


@dataclass(frozen=True)
class EmbedderFacts:
    """What the face commands need of the embedder version a request holds."""

    name: str
    sha256: str                    # the gallery's id of its vectors: the model file's sha256
    size: tuple[int, int]          # its input, width and height
    margin: float                  # face.crop_margin: a box-only crop's enlargement
    calibration: Calibration | None

    @classmethod
    def of(cls, model_dir: ModelDir) -> EmbedderFacts:
        manifest = model_dir.manifest
        face = manifest.face or FaceSpec()
        calibration = None
        if face.calibration is not None:
            calibration = Calibration.from_json(face.calibration.model_dump(exclude_none=True))
        return cls(model_dir.name, embedder_sha256(model_dir), (manifest.input.width, manifest.input.height),
                   face.crop_margin, calibration)

    def calibrated(self) -> Calibration:
        """Its calibration; FacesUnavailable, saying how to make one, when model.json has none: a threshold is
        never assumed (a raw cosine means something else for every embedder)."""
        if self.calibration is None:
            raise FacesUnavailable(
                f"the face embedder {self.name!r} has no calibration, so a similarity cannot be told as a "
                "confidence. Fix: python -m converter face-threshold --models MODEL_DIR --detector DETECTOR "
                f"--embedder {self.name} PEOPLE_DIR (one folder of photos per person), then reload the model; or "
                f"set face.calibration {{\"threshold\": T}} in its model.json by hand")
        return self.calibration


def embedder_sha256(model_dir: ModelDir) -> str:
    """The embedder's id in the gallery: its int8 file's sha256 (the same model whatever backend runs it; a model
    imported as a compiled file alone: that file's)."""
    files = model_dir.manifest.files
    entry = files.get("int8") or files[sorted(files)[0]]
    return entry.sha256


class FaceModels:
    """FACE_DETECTOR and FACE_EMBEDDER against the models served now (`pair()`)."""

    def __init__(self, settings: Settings, served):
        """`served(task)`: the names of the served models of a task (Core.models)."""
        self.detector = settings.face_detector
        self.embedder = settings.face_embedder
        self._served = served

    def pair(self) -> FacePair:
        """The two models, each served and of its task; FacesUnavailable saying the fix otherwise."""
        detector = self._check("face_detector", self.detector, DETECTION, "finds the faces")
        embedder = self._check("face_embedder", self.embedder, EMBEDDING, "tells them apart")
        return FacePair(detector, embedder)

    def problem(self) -> str | None:
        """Why the face routes answer 503 now; None when they serve."""
        try:
            self.pair()
        except FacesUnavailable as e:
            return str(e)
        return None

    def _check(self, setting: str, name: str | None, task: str, role: str) -> str:
        variable = f"{ENV_PREFIX}{setting.upper()}"
        of_task = self._served(task)
        if of_task:
            fill = f"set {variable} to one of the served {task} models: {', '.join(of_task)}"
        else:
            fill = (f"serve a {task} model (none is served: import one with python -m converter import, "
                    f"{HOW_TO_IMPORT}) and set {variable} to its name")
        if name is None:
            raise FacesUnavailable(f"face recognition is off: {variable} (the {task} model that {role}) is unset. "
                                   f"Fix: {fill}")
        if name not in of_task:
            every = self._served(None)
            what = "is not served" if name not in every else f"is not a {task} model"
            raise FacesUnavailable(f"face recognition is off: {variable}={name} {what}. Fix: {fill}")
        return name
