"""The model directory: the unit of deployment shared by the converter and the service.

    models/<name>/
      model.json                   what the model is, how to feed it, where it came from
      labels.txt                   one label per line: line i names class i (a blank line: an id with no label)
      <name>_int8.tflite           full-integer model (cpu and emulated backends)
      <name>_int8_edgetpu.tflite   the same, compiled for the Edge TPU (when compiled)

A segmented model (python -m converter segment) has instead one file per segment, kinds
`int8_segment_<i>` (and `edgetpu_segment_<i>` when compiled), and a `segments` entry
listing them in order; the service runs it as a pipeline (app/pipeline.py).

model.json records the sha256 of every file, so a loader can refuse a file that
does not match what the converter wrote. Directories are written whole, through a
temporary sibling and a rename, so a reader never sees a half-written model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.errors import ModelDirError

MANIFEST = "model.json"
INT8 = "int8"
EDGETPU = "edgetpu"
LABELS = "labels"


def int8_filename(name: str) -> str:
    return f"{name}_int8.tflite"


def edgetpu_filename(name: str) -> str:
    return f"{name}_int8_edgetpu.tflite"


def segment_kind(kind: str, index: int) -> str:
    """The file kind of segment `index` of a model's `kind` file: int8_segment_0, edgetpu_segment_2."""
    return f"{kind}_segment_{index}"


class InputSpec(BaseModel):
    """How an image becomes the model's input: geometry, then normalisation.

    The float value the network was trained on is `real = (pixel - mean) / std`
    per channel; the engine's input tensor quantization then maps `real` to int.
    """

    model_config = ConfigDict(extra="forbid")

    width: int = Field(gt=0, le=4096)
    height: int = Field(gt=0, le=4096)
    channels: Literal[1, 3] = 3
    # center_crop: the central region holding crop_fraction of the shorter side, scaled to width x height.
    # stretch: the whole image scaled to width x height (its aspect ratio not kept).
    # letterbox: the whole image scaled to fit inside width x height, aspect ratio kept, placed at the top-left;
    # the rest (right or bottom) is black, pixel value 0 before normalisation (pycoral's set_resized_input).
    resize: Literal["center_crop", "stretch", "letterbox"] = "center_crop"
    # center_crop only: 0.875 = the classic "resize 256, crop 224".
    crop_fraction: float = Field(default=0.875, gt=0.0, le=1.0)
    mean: list[float] = Field(min_length=1, max_length=3)
    std: list[float] = Field(min_length=1, max_length=3)


class OutputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # logits: scores are softmax(dequantized output); probabilities: used as they are.
    scores: Literal["logits", "probabilities"] = "logits"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class TensorQuantization(BaseModel):
    """One integer I/O tensor: real = scale * (q - zero_point)."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["uint8", "int8"]
    shape: list[int]
    scale: float
    zero_point: int


class Quantization(BaseModel):
    """What the converter wrote: operator counts and the integer I/O tensors."""

    model_config = ConfigDict(extra="forbid")

    operators: dict[str, int]
    input: TensorQuantization
    # None: the outputs are float by design, a detector's TFLite_Detection_PostProcess (decoded boxes, class ids,
    # scores, count); its `outputs` name them by role.
    output: TensorQuantization | None = None


class Accuracy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    top1_correct: int = Field(ge=0)
    top5_correct: int = Field(ge=0)
    samples: int = Field(gt=0)
    top1: float
    top5: float


class Evaluation(BaseModel):
    """Accuracy on a labelled dataset: the int8 model, and the float one when it was given."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    data: str
    samples: int = Field(gt=0)
    int8: Accuracy
    float_: Accuracy | None = Field(default=None, alias="float")
    top1_agreements: int | None = None
    top1_agreement: float | None = None
    top1_drop_points: float | None = None
    float_model: str | None = None


class Agreement(BaseModel):
    """int8 vs float on unlabelled inputs: same top-1, float top-1 inside int8 top-5, largest logit error."""

    model_config = ConfigDict(extra="forbid")

    inputs: int = Field(gt=0)
    top1_agreement: float
    float_top1_in_int8_top5: float
    # max |int8 logit - float logit| over all inputs and classes (dequantized); None where not measured
    max_logit_error: float | None = None
    disagreements: list[str] = Field(default_factory=list)


class DetectionAgreement(BaseModel):
    """int8 vs float detections on unlabelled photos. The float model's objects are its detections scoring at least
    score_threshold; the int8 model finds one when one of its own detections of the same class, also scoring at least
    score_threshold, overlaps it with IoU >= iou_threshold (matched greedily, best IoU first, one to one)."""

    model_config = ConfigDict(extra="forbid")

    photos: int = Field(gt=0)
    score_threshold: float
    iou_threshold: float
    float_objects: int = Field(ge=0)
    found: int = Field(ge=0)
    recall: float | None = None        # found / float_objects; None when the float model saw nothing
    int8_extra: int = Field(ge=0)      # int8 detections over the threshold that match no float object
    iou_min: float | None = None       # over the found objects
    iou_median: float | None = None
    iou_mean: float | None = None
    max_score_error: float | None = None  # max |int8 score - float score| over the found objects
    # photo -> the IoU of each object found there, in the float model's score order
    per_photo: dict[str, list[float]] = Field(default_factory=dict)


class Quality(BaseModel):
    """What quantization cost, measured: served as-is by /v1/models."""

    model_config = ConfigDict(extra="forbid")

    reference: str | None = None  # what the int8 model was compared with
    data: str | None = None  # what it was compared on
    agreement: dict[str, Agreement] | None = None  # named input sets -> int8 vs float on them
    detection: dict[str, DetectionAgreement] | None = None  # a detector's: named photo sets -> int8 vs float boxes
    evaluation: Evaluation | None = None  # labelled accuracy (python -m converter evaluate)


class EdgeTpuCompile(BaseModel):
    """The record of `python -m converter compile`: how, with what, and the compiler's own report."""

    model_config = ConfigDict(extra="forbid")

    command: str
    compiler_version: str
    min_runtime_version: int
    model_min_runtime_version: int | None = None
    int8_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    segments: int = Field(ge=1)
    report: dict  # converter.compiler_log.CompilerReport.as_dict()
    offline_analysis: str
    segment_reports: list[dict] | None = None


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
    # The output tensors by role, as the task names them (classification: scores; detection: boxes,
    # classes, scores, count), each the tensor's name in the model file: the roles are read from
    # the graph (a detector's TFLite_Detection_PostProcess outputs), never from output positions.
    # Empty: a classifier's one output.
    outputs: dict[str, str] = Field(default_factory=dict)
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

    def to_json(self) -> str:
        """The one serialisation of model.json (files last, absent facts left out)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not data["outputs"]:  # a classifier's one output needs no name
            del data["outputs"]
        data["files"] = data.pop("files")
        return json.dumps(data, indent=2) + "\n"

    def quality_dict(self) -> dict | None:
        return None if self.quality is None else self.quality.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class ModelDir:
    path: Path
    manifest: Manifest
    labels: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.manifest.name

    def file(self, kind: str) -> Path:
        """Path of a file kind (int8, edgetpu, labels) after checking its sha256."""
        entry = self.manifest.files.get(kind)
        if entry is None:
            if kind == INT8 and self.has(EDGETPU):
                raise ModelDirError(no_cpu_form(self))
            raise ModelDirError(f"model {self.name!r} has no {kind!r} file in {self.path / MANIFEST}")
        path = self.path / entry.path
        if not path.is_file():
            raise ModelDirError(f"model {self.name!r}: {path} is listed in {MANIFEST} but missing")
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise ModelDirError(
                f"model {self.name!r}: {path} has sha256 {actual}, {MANIFEST} expects {entry.sha256}; "
                "the file was changed or corrupted after it was built: rebuild it with the command in "
                f"{MANIFEST} 'build.command'"
            )
        return path

    def has(self, kind: str) -> bool:
        return kind in self.manifest.files

    def missing(self, kind: str) -> str | None:
        """Why a backend that runs `kind` files cannot serve this model (None: it can, or the model is
        segmented and its loader checks each segment's file)."""
        if self.manifest.segments is not None or self.has(kind):
            return None
        if kind == INT8 and self.has(EDGETPU):
            return no_cpu_form(self)
        return f"model {self.name!r} has no {kind!r} file (model.json lists {sorted(self.manifest.files)})"

    def segment_files(self, kind: str) -> list[Path]:
        """A segmented model's files of `kind` (int8, edgetpu), in pipeline order, sha256 checked."""
        segments = self.manifest.segments
        if segments is None:
            raise ModelDirError(f"model {self.name!r} is not segmented (no 'segments' in {MANIFEST})")
        return [self.file(segment_kind(kind, i)) for i in range(segments.count)]


def no_cpu_form(model: ModelDir) -> str:
    """Why a model that has only its Edge TPU file runs nowhere but on an Edge TPU, and the fix."""
    compiled = model.manifest.files[EDGETPU].path
    imported = model.manifest.imported
    given = next((f.name for f in imported.files if f.kind == EDGETPU), compiled) if imported else compiled
    plain = given.removesuffix("_edgetpu.tflite") + ".tflite" if given.endswith("_edgetpu.tflite") else "MODEL.tflite"
    return (f"model {model.name!r} has no CPU form: only its Edge TPU file {compiled} is here, which runs only "
            "through libedgetpu's delegate on an Edge TPU. Fix: import the plain .tflite it was compiled from "
            f"beside it: python -m converter import {plain} {given} --name {model.name} --replace")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_model_dir(path: Path) -> ModelDir:
    """Read and validate a model directory: the manifest, and the labels against their sha256 (model files on demand)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    try:
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{path} is not a model directory: {MANIFEST} is missing") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"cannot read {manifest_path}: {e}") from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise ModelDirError(f"invalid {manifest_path}: {e}") from None
    model = ModelDir(path=path, manifest=manifest, labels=())
    labels: tuple[str, ...] = ()
    if model.has(LABELS):
        labels_path = model.file(LABELS)  # sha256 checked, like every other file
        try:
            labels = tuple(labels_path.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as e:
            raise ModelDirError(f"cannot read labels of {manifest.name!r}: {e}") from None
    return ModelDir(path=path, manifest=manifest, labels=labels)


def discover(root: Path) -> dict[str, Path]:
    """Model name -> directory, for every sub-directory of root holding a model.json."""
    root = Path(root)
    if not root.is_dir():
        raise ModelDirError(f"model directory {root} does not exist")
    found = {}
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and (child / MANIFEST).is_file():
            found[child.name] = child
    return found


def file_entry(path: Path, relative_to: Path) -> FileEntry:
    return FileEntry(
        path=str(path.relative_to(relative_to)),
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
    )


def _as_manifest(manifest: Manifest | dict) -> Manifest:
    return manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)


def write_model_dir(root: Path, manifest: Manifest | dict, files: dict[str, tuple[str, bytes]],
                    replace: bool = False) -> Path:
    """Write models/<name>/ whole, atomically: a complete new directory or the old one.

    files maps a kind (int8, labels, ...) to (filename, content); their entries
    (path, sha256, bytes) are filled into the manifest here. Files already in an
    existing directory that this write does not name are kept (e.g. a compiled
    Edge TPU model when only the int8 model is rebuilt) along with their entries,
    unless `replace`: then the new directory holds only these files.
    """
    manifest = _as_manifest(manifest)
    root = Path(root)
    target = root / manifest.name
    root.mkdir(parents=True, exist_ok=True)
    kept = {}
    if not replace and target.is_dir() and (target / MANIFEST).is_file():
        previous = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
        kept = {kind: FileEntry.model_validate(entry) for kind, entry in previous.get("files", {}).items()
                if kind not in files and (target / entry["path"]).is_file()}
    _replace_whole(target, manifest, kept, files)
    return target


def _merged(model_dir: Path, fields: dict) -> Manifest:
    """The existing manifest with top-level fields replaced, validated."""
    current = read_model_dir(model_dir).manifest
    data = current.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.update({k: (v.model_dump(mode="json", by_alias=True, exclude_none=True) if isinstance(v, BaseModel) else v)
                 for k, v in fields.items()})
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ModelDirError(f"{model_dir / MANIFEST}: the new fields do not validate: {e}") from None


def update_manifest(model_dir: Path, **fields) -> None:
    """Replace top-level fields of an existing model.json, atomically (write + rename)."""
    path = Path(model_dir) / MANIFEST
    text = _merged(model_dir, fields).to_json()
    tmp = path.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename staging to target; an existing target is moved aside first, then removed."""
    if not target.exists():
        os.rename(staging, target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def add_files(model_dir: Path, files: dict[str, tuple[str, bytes]], remove: tuple[str, ...] = (),
              **fields) -> None:
    """Add or replace files of an existing model directory and merge manifest fields, atomically.

    Like write_model_dir, the change lands whole (a new directory swapped in) or not at all.
    `remove` drops file kinds first (their files and entries), e.g. the previous compilation's
    segments. The directory's name must be its manifest's name, as the service requires.
    """
    model_dir = Path(model_dir)
    manifest = _merged(model_dir, fields)
    if manifest.name != model_dir.name:
        raise ModelDirError(f"{model_dir}: model.json names {manifest.name!r}, the directory {model_dir.name!r}")
    kept = {kind: entry for kind, entry in manifest.files.items() if kind not in remove and kind not in files}
    _replace_whole(model_dir, manifest, kept, files)


def _replace_whole(target: Path, manifest: Manifest, kept: dict[str, FileEntry],
                   files: dict[str, tuple[str, bytes]]) -> None:
    """Stage the complete new directory beside target (kept files copied from it, new ones
    written, the manifest validated and everything fsynced), then swap it in."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        entries = {}
        for kind, entry in kept.items():
            shutil.copy2(target / entry.path, staging / entry.path)
            entries[kind] = entry
        for kind, (filename, content) in files.items():
            (staging / filename).write_bytes(content)
            entries[kind] = file_entry(staging / filename, staging)
        full = manifest.model_copy(update={"files": entries})
        text = Manifest.model_validate_json(full.to_json()).to_json()  # never write what the service would refuse
        (staging / MANIFEST).write_text(text, encoding="utf-8")
        for f in staging.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(staging, 0o755)
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
