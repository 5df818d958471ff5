"""What the converter measured and recorded in model.json: the I/O quantization, the quality it measured
(labelled accuracy, agreement with the float model, a detector's boxes) and the Edge TPU compiler's record.

The converter writes these; the service reads none of their fields, but validates them as part of `Manifest`
(app/model_dir/schema.py) when it reads a model.json, so a malformed record is refused there, and serves the
quality as it is (GET /v1/models).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
