"""model.json's format: `Manifest`, the records the service reads, and the names of the files it lists.

One validated format: the service reads every model.json through `Manifest` (app/model_dir/reading.py), the
writers write none that `Manifest` would refuse (app/model_dir/writing.py). The converter's own records
(quality, quantization, the compile report) are app/model_dir/records.py.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.model_dir.records import EdgeTpuCompile, Quality, Quantization

MANIFEST = "model.json"
INT8 = "int8"
EDGETPU = "edgetpu"
LABELS = "labels"
ANCHORS = "anchors"             # a prior-box detector's anchor file (`converter import --anchors`): docs/faces.md
ANCHORS_FILE = "anchors.json"


def int8_filename(name: str) -> str:
    return f"{name}_int8.tflite"


def edgetpu_filename(name: str) -> str:
    return f"{name}_int8_edgetpu.tflite"


def segment_kind(kind: str, index: int) -> str:
    """The file kind of segment `index` of a model's `kind` file: int8_segment_0, edgetpu_segment_2."""
    return f"{kind}_segment_{index}"


# Whose preprocessing a model follows (model.json `input.convention`; app/imaging applies it):
#   coral        Coral's and TensorFlow Lite's (pycoral, the Task Library): a letterbox at the top-left, padded with
#                black (pixel 0); the input quantized as TFLite's QUANTIZE does (round half away from zero); boxes
#                back through the region resized. Every model built here, and every model.json without the field.
#   ultralytics  Ultralytics' predictor (`yolo predict`, YOLOv5's detect.py): LetterBox(center=True), the image
#                resized to (round(w r), round(h r)), r = min(H / h, W / w), placed at (round(dw / 2 - 0.1),
#                round(dh / 2 - 0.1)) and padded with grey 114; the input quantized as AutoBackend does
#                (float32 x / scale + zero_point, truncated toward zero); boxes back as scale_boxes maps them.
CORAL, ULTRALYTICS = "coral", "ultralytics"
CONVENTIONS = (CORAL, ULTRALYTICS)
# Ultralytics' predictor feeds pixels / 255 (mean 0, std 255) into every model, quantized input or not; its exporter
# packs its metadata in a zip appended to the model, as temp_meta.txt (8.2-8.3: a Python dict's repr) or
# metadata.json (8.4)
ULTRALYTICS_MEAN, ULTRALYTICS_STD = [0.0], [255.0]
ULTRALYTICS_FILES = ("metadata.json", "temp_meta.txt")


class Convention(BaseModel):
    """Whose preprocessing the model follows (CONVENTIONS), and why: what in the file, or which flag, said so."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["coral", "ultralytics"]
    why: str


class InputSpec(BaseModel):
    """How an image becomes the model's input: geometry, then normalisation, as its maker's convention does them.

    The float value the network was trained on is `real = (pixel - mean) / std`
    per channel; the engine's input tensor quantization then maps `real` to int.
    """

    model_config = ConfigDict(extra="forbid")

    width: int = Field(gt=0, le=4096)
    height: int = Field(gt=0, le=4096)
    channels: Literal[1, 3] = 3
    # center_crop: the central region holding crop_fraction of the shorter side, scaled to width x height.
    # stretch: the whole image scaled to width x height (its aspect ratio not kept).
    # letterbox: the whole image scaled to fit inside width x height, aspect ratio kept; where it is placed and what
    # pads the rest is the convention's: Coral's at the top-left on black, pixel value 0 before normalisation
    # (pycoral's set_resized_input), Ultralytics' centred on grey 114 (its LetterBox).
    resize: Literal["center_crop", "stretch", "letterbox"] = "center_crop"
    # center_crop only: 0.875 = the classic "resize 256, crop 224".
    crop_fraction: float = Field(default=0.875, gt=0.0, le=1.0)
    mean: list[float] = Field(min_length=1, max_length=3)
    std: list[float] = Field(min_length=1, max_length=3)
    # whose preprocessing (CONVENTIONS); absent: Coral's, as every model built here (written by `converter import`)
    convention: Convention | None = None

    @property
    def maker(self) -> str:
        """The convention's name: coral when model.json names none."""
        return CORAL if self.convention is None else self.convention.name


class OutputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # logits: scores are softmax(dequantized output); probabilities: used as they are.
    scores: Literal["logits", "probabilities"] = "logits"


# ---- a detector's decoding (model.json `detection`) ----------------------------------------------------

POSTPROCESS, YOLO, YOLO_DFL, PRIORS = "postprocess", "yolo", "yolo_dfl", "priors"
# Each decoder's roles in model.json `outputs` (role -> the output tensor's name in the model file):
#   postprocess  TFLite_Detection_PostProcess's four outputs (SSD, EfficientDet-Lite): the op decodes and suppresses;
#   yolo         Ultralytics' one tensor: [1, 4 + C, N] or [1, N, 4 + C] (box, then class scores; YOLOv5: box,
#                objectness, class scores), no NMS in the graph;
#   yolo_dfl     the Coral layout Frigate serves: class logits [1, N, C] and DFL box distributions
#                [1, N, 4 * reg_max] (left, top, right, bottom; reg_max bins each), anchors at the grid cells;
#   priors       a face detector's raw outputs against N prior boxes (app/tasks/priors.py): box locations (or, exported
#                with is_test=True, decoded corners) [1, N, 4] and scores [1, N, 2] (column 1 the face), and with
#                `landmarks` their offsets [1, N, 2L] (RetinaFace's five points: role `landmarks`).
DECODER_ROLES: dict[str, tuple[str, ...]] = {
    POSTPROCESS: ("boxes", "classes", "scores", "count"),
    YOLO: ("predictions",),
    YOLO_DFL: ("class_logits", "box_distributions"),
    PRIORS: ("boxes", "scores"),
}
LANDMARKS = "landmarks"  # the priors decoder's optional role
# What the decoders fall back on when model.json does not say (the values Ultralytics' and YOLOv5's predict use
# for conf and iou; at most 100 objects, as the SSD exports' post-process op usually keeps).
DEFAULT_MIN_SCORE = 0.25
DEFAULT_NMS_IOU = 0.45
DEFAULT_MAX_DETECTIONS = 100
DEFAULT_STRIDES = (8, 16, 32)
DEFAULT_REG_MAX = 16
# The priors decoder's: ULFD's own (its TFLite predictor's conf_threshold 0.6 and NMS IoU 0.3), its variances
PRIORS_MIN_SCORE = 0.6
PRIORS_NMS_IOU = 0.3
PRIORS_VARIANCES = (0.1, 0.2)
# The prior sets built in (app/tasks/priors.py), by model.json's detection.anchors; "file": the model directory's
# anchor file (files.anchors)
BUILT_IN_ANCHORS = ("ultra_light", "retinaface")
ANCHORS_IN_FILE = "file"


def grid_cells(width: int, height: int, strides) -> int:
    """The cells of a YOLO head's grids over a width x height input, one grid per stride (height // stride rows,
    width // stride columns): its anchor count, one anchor a cell."""
    return sum((height // s) * (width // s) for s in strides)


class DetectionSpec(BaseModel):
    """How a detector's output tensors become objects: which decoder, and its parameters. Absent from model.json:
    the `postprocess` decoder (the op in the file decodes and suppresses), as every detector before YOLO.

    The YOLO and priors decoders run on the CPU in numpy after the model (app/tasks/yolo.py, app/tasks/priors.py),
    the same on every backend, and give the rows the post-process op gives: boxes (ymin, xmin, ymax, xmax)
    normalized to the model's input, class ids and scores, best first. Their thresholds here are the model's
    defaults; a request may override min_score and max_detections (/v1/detect, DeepStack's min_confidence).
    """

    model_config = ConfigDict(extra="forbid")

    decoder: Literal["postprocess", "yolo", "yolo_dfl", "priors"] = POSTPROCESS
    classes: int | None = Field(default=None, ge=1)  # C: class scores per candidate
    # yolo: where the box is in the tensor ([1, 4 + C, N]: attributes first, Ultralytics' export; [1, N, 4 + C]:
    # anchors first, a transposed export and YOLOv5), its format (xywh: centre and size; xyxy: corners) and scale
    # (normalized: fractions of the input, as Ultralytics' TFLite exports write them; pixels: of the input)
    layout: Literal["attributes_first", "anchors_first"] | None = None
    box_format: Literal["xywh", "xyxy"] | None = None
    box_scale: Literal["normalized", "pixels"] | None = None
    objectness: bool | None = None  # yolo: YOLOv5's objectness after the box (score = objectness * class score)
    # yolo_dfl: the grid strides, in input pixels, in the order the anchors are listed; bins per box side
    strides: list[int] | None = Field(default=None, min_length=1)
    reg_max: int | None = Field(default=None, ge=1, le=64)
    # class scores as the tensor holds them: sigmoid (logits, the decoder applies a sigmoid), softmax (priors: the
    # two columns' logits, the decoder applies a softmax) or none (probabilities)
    score_activation: Literal["sigmoid", "softmax", "none"] | None = None
    # priors: the boxes as raw locations against the priors ("priors") or corners decoded in the graph ("decoded",
    # an is_test=True export); the priors (BUILT_IN_ANCHORS at the model's input size, or "file": files.anchors)
    # and their variances [centre, size]; the landmarks each prior gives (RetinaFace: 5), None for none
    box_encoding: Literal["priors", "decoded"] | None = None
    anchors: Literal["ultra_light", "retinaface", "file"] | None = None
    variances: list[float] | None = Field(default=None, min_length=2, max_length=2)
    landmarks: int | None = Field(default=None, ge=1, le=68)
    nms_iou: float | None = Field(default=None, gt=0.0, le=1.0)  # suppress a box overlapping a better one by more
    class_agnostic: bool | None = None  # NMS across classes (true) or within each class (false)
    min_score: float | None = Field(default=None, ge=0.0, le=1.0)  # the default threshold
    max_detections: int | None = Field(default=None, ge=1, le=1000)

    @model_validator(mode="after")
    def _fits_its_decoder(self):
        """Each decoder's parameters filled with their defaults; a parameter of another decoder refused."""
        priors_only = ("box_encoding", "anchors", "variances", "landmarks")
        yolo_only = ("layout", "box_format", "box_scale", "objectness")
        foreign = {
            POSTPROCESS: (*yolo_only, "strides", "reg_max", "score_activation", "nms_iou", "class_agnostic",
                          *priors_only),
            YOLO: ("strides", "reg_max", *priors_only),
            YOLO_DFL: (*yolo_only, *priors_only),
            PRIORS: (*yolo_only, "strides", "reg_max"),
        }[self.decoder]
        given = [name for name in foreign if getattr(self, name) is not None]
        if given:
            raise ValueError(f"detection.decoder {self.decoder!r} takes no {', '.join(given)} (its parameters: "
                             f"{', '.join(sorted(set(DetectionSpec.model_fields) - set(foreign) - {'decoder'}))})")
        if self.decoder == YOLO:
            missing = [name for name in ("classes", "layout", "box_scale") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"detection.decoder 'yolo' needs {', '.join(missing)} (python -m converter import "
                                 "writes them, or asks for a flag where the file cannot tell)")
            self._fill(box_format="xywh", objectness=False, score_activation="none")
        elif self.decoder == YOLO_DFL:
            if self.classes is None:
                raise ValueError("detection.decoder 'yolo_dfl' needs classes")
            self._fill(strides=list(DEFAULT_STRIDES), reg_max=DEFAULT_REG_MAX, score_activation="sigmoid")
        elif self.decoder == PRIORS:
            self._fits_priors()
        if self.decoder != PRIORS and self.score_activation == "softmax":
            raise ValueError(f"detection.decoder {self.decoder!r}: score_activation 'softmax' is the priors decoder's "
                             "(two columns, background and face); its scores are 'sigmoid' or 'none'")
        if self.decoder != POSTPROCESS:
            self._fill(nms_iou=DEFAULT_NMS_IOU, class_agnostic=False, min_score=DEFAULT_MIN_SCORE,
                       max_detections=DEFAULT_MAX_DETECTIONS)
        return self

    def _fits_priors(self) -> None:
        """A face detector's: one class (column 1 of its scores), its box encoding said, scores softmax or none."""
        if self.box_encoding is None:
            raise ValueError("detection.decoder 'priors' needs box_encoding: 'priors' (raw locations against the "
                             "priors) or 'decoded' (corners, an is_test=True export); python -m converter import "
                             "tells them apart by running the model")
        if self.classes not in (None, 1):
            raise ValueError(f"detection.decoder 'priors' reads one class (scores [1, N, 2]: background, face); "
                             f"classes {self.classes}")
        if self.score_activation == "sigmoid":
            raise ValueError("detection.decoder 'priors': score_activation is 'softmax' (logits of the two "
                             "columns) or 'none' (probabilities)")
        if self.variances is not None and not all(0 < v < 10 for v in self.variances):
            raise ValueError(f"detection.variances are two positive numbers [centre, size]; got {self.variances}")
        self._fill(classes=1, anchors="ultra_light", variances=list(PRIORS_VARIANCES), score_activation="none",
                   nms_iou=PRIORS_NMS_IOU, class_agnostic=True, min_score=PRIORS_MIN_SCORE)

    def _fill(self, **defaults) -> None:
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def roles(self) -> tuple[str, ...]:
        return DECODER_ROLES[self.decoder] + ((LANDMARKS,) if self.landmarks else ())


# The spec of a detector whose model.json has no `detection`, made once: every request to a detector asks for its
# spec, and a pydantic model's construction took about 50 us of the event loop's time per request (cold, on 2 cores)
POSTPROCESS_SPEC = DetectionSpec()


# ---- an embedder's face facts (model.json `face`) ------------------------------------------------------

EMBEDDING = "embedding"  # model.json's task of an embedder (app/tasks/embed.py)
# The crop around a face box without landmarks, enlarged 1 + margin times (app/faces/align.py DEFAULT_MARGIN and
# MARGIN_MAX, which tests/test_model_dir_face.py holds these to)
DEFAULT_CROP_MARGIN = 0.2
CROP_MARGIN_MAX = 3.0


class FaceCalibration(BaseModel):
    """The embedder's confidence map (app/faces/confidence.py Calibration): the threshold (confidence 0.5) and the
    typical same-person and different-person similarities, different < threshold < same, inside (-1, 1); a
    threshold alone (set by hand) has neither, and the map spreads them from it."""

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(gt=-1.0, lt=1.0, strict=True)
    same: float | None = Field(default=None, gt=-1.0, lt=1.0, strict=True)
    different: float | None = Field(default=None, gt=-1.0, lt=1.0, strict=True)

    @model_validator(mode="after")
    def _ordered(self):
        if (self.same is None) != (self.different is None):
            raise ValueError("face.calibration gives both `same` and `different`, or neither")
        if self.same is not None and not self.different < self.threshold < self.same:
            raise ValueError(f"face.calibration has different < threshold < same; got different {self.different}, "
                             f"threshold {self.threshold}, same {self.same}")
        return self


class FaceSpec(BaseModel):
    """What the face routes need of an embedder beyond its input: how a face box without landmarks is cropped, and
    the calibration that maps its similarities to a client's confidence (`python -m converter face-threshold`)."""

    model_config = ConfigDict(extra="forbid")

    crop_margin: float = Field(default=DEFAULT_CROP_MARGIN, ge=0.0, le=CROP_MARGIN_MAX, strict=True)  # never `true`
    calibration: FaceCalibration | None = None


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class Segment(BaseModel):
    """One segment of a pipelined model: the tensors that cross its ends and what it holds."""

    model_config = ConfigDict(extra="forbid")

    input: str    # name of the tensor entering it (the model's input for the first)
    output: str   # name of the tensor leaving it (the model's output for the last)
    first_operator: int = Field(ge=0)  # in the whole model's execution order
    operators: int = Field(ge=1)
    cost: float | None = None  # in the unit of Segments.balanced_by
    # the last segment of a model with several outputs (a detector's post-processing): all of them, in
    # the model's order (`output` is the first); absent otherwise
    outputs: list[str] | None = None


class Segments(BaseModel):
    """The model cut into sequential segments (python -m converter segment), served as a pipeline:
    segment i on device i (edgetpu) or interpreter i (cpu, emulated). Segment i's files are the
    kinds `int8_segment_<i>` and, when compiled, `edgetpu_segment_<i>`. Absent: one whole model."""

    model_config = ConfigDict(extra="forbid")

    source: str                   # the whole int8 model it was cut from (file name)
    source_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    balanced_by: str              # what the cost of each segment measures, or who chose the cuts
    items: list[Segment] = Field(min_length=1)

    @property
    def count(self) -> int:
        return len(self.items)


class EdgeTpuEstimate(BaseModel):
    """converter.estimate: Edge TPU latency per invoke estimated from the model's structure, not measured."""

    model_config = ConfigDict(extra="allow")

    latency_ms: dict[str, float]  # per link: usb3, usb2, rpi4, pcie, devboard
    parameters: dict[str, int]    # bytes, on_chip_bytes, streamed_bytes, cache_bytes
    ops: dict[str, int]           # edgetpu, cpu
    error: dict                   # the stated (leave-one-out) error and its text
    method: str


class ImportedFile(BaseModel):
    """A file a model directory was imported from, as the user gave it."""

    model_config = ConfigDict(extra="forbid")

    name: str                  # its file name where it came from
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)
    kind: str                  # the file kind it became here (int8, edgetpu)


class Imported(BaseModel):
    """Provenance of a model brought in as a file (python -m converter import), not built here:
    what was given, and where each fact of model.json came from (the file, its TFLite metadata, a
    flag), so that a reader can tell what the importer read from what it was told."""

    model_config = ConfigDict(extra="forbid")

    files: list[ImportedFile] = Field(min_length=1)
    labels: str                # where labels.txt came from
    input: str                 # where the input spec (normalization, resize) came from
    scores: str                # how the output's meaning was decided (logits or probabilities)
    metadata: dict = Field(default_factory=dict)  # the file's own TFLite metadata: name, author, license, ...
    compiler: dict | None = None  # an imported Edge TPU file: what its edgetpu-custom-op records
    task: str | None = None    # how the task was read from the graph (or --task)
    notes: list[str] = Field(default_factory=list)


class Build(BaseModel):
    """Provenance: the command that rebuilds the directory and what it was made with."""

    model_config = ConfigDict(extra="allow")  # recipes add their own facts (training, data, timings)

    command: str
    seed: int | None = None
    calibration: str | None = None
    tools: dict[str, str] = Field(default_factory=dict)
    convert_seconds: float | None = None


class Manifest(BaseModel):
    """model.json, written only through this module. Unknown top-level keys are kept."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # What the model's outputs mean, and so which task module (app/tasks/) turns them into an
    # answer; the registry refuses a task it has no module for, and checks `outputs` against it.
    task: str = Field(default="classification", pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""
    source: str
    licence: str
    input: InputSpec
    output: OutputSpec = OutputSpec()
    # The output tensors by role, as the task names them (classification: scores; detection: its decoder's,
    # DECODER_ROLES: boxes, classes, scores, count for the post-process op), each the tensor's name in the model
    # file: the roles are read from the graph (a detector's TFLite_Detection_PostProcess outputs, a YOLO head's
    # tensors told apart by shape), never from output positions.
    # Empty: a classifier's one output.
    outputs: dict[str, str] = Field(default_factory=dict)
    # a detector's decoder and its parameters (DetectionSpec); absent: TFLite_Detection_PostProcess's rows
    detection: DetectionSpec | None = None
    # an embedder's face facts (FaceSpec: crop margin, calibration); absent: the defaults, no calibration
    face: FaceSpec | None = None
    quantization: Quantization | None = None
    edgetpu_analysis: str | None = None
    quality: Quality | None = None
    build: Build | None = None
    edgetpu_compile: EdgeTpuCompile | None = None
    segments: Segments | None = None
    edgetpu_estimate: EdgeTpuEstimate | None = None
    imported: Imported | None = None  # set when the model came in as a file, not from a recipe
    files: dict[str, FileEntry] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _earlier_layouts(cls, data):
        """Read the layouts written before this one: a top-level `evaluation`, agreement sets directly in `quality`."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        quality = dict(data.get("quality") or {})
        if "evaluation" in data:
            quality.setdefault("evaluation", data.pop("evaluation"))
        known = set(Quality.model_fields)
        loose = {k: v for k, v in quality.items() if k not in known and isinstance(v, dict) and "inputs" in v}
        if loose:
            quality = {k: v for k, v in quality.items() if k not in loose}
            quality["agreement"] = {**loose, **(quality.get("agreement") or {})}
        if quality:
            data["quality"] = quality
        return data

    @model_validator(mode="after")
    def _detection_fits(self):
        """`detection` belongs to a detector, and `outputs` names only its decoder's roles."""
        if self.face is not None and self.task != EMBEDDING:
            raise ValueError(f"`face` (an embedder's crop margin and calibration) in a model of task {self.task!r}")
        if self.detection is None:
            return self
        if self.task != "detection":
            raise ValueError(f"`detection` (a detector's decoding) in a model of task {self.task!r}")
        unknown = sorted(set(self.outputs) - set(self.detection.roles))
        if unknown:
            raise ValueError(f"`outputs` names {unknown}, roles the {self.detection.decoder!r} decoder does not read "
                             f"(its roles: {list(self.detection.roles)})")
        return self

    def detection_spec(self) -> DetectionSpec:
        """The detector's decoding: model.json `detection`, or the post-process op's when absent."""
        return self.detection if self.detection is not None else POSTPROCESS_SPEC

    def to_json(self) -> str:
        """The one serialisation of model.json (files last, absent facts left out)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not data["outputs"]:  # a classifier's one output needs no name
            del data["outputs"]
        data["files"] = data.pop("files")
        return json.dumps(data, indent=2) + "\n"

    def quality_dict(self) -> dict | None:
        return None if self.quality is None else self.quality.model_dump(mode="json", by_alias=True, exclude_none=True)
