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
