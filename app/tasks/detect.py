"""Detection: a detector's post-processed outputs -> objects with labels, scores and boxes in the original
image's pixels.

Four roles, the outputs of TFLite_Detection_PostProcess (SSD, EfficientDet-Lite): `boxes` [1, N, 4] (ymin,
xmin, ymax, xmax, normalized to the model's input), `classes` [1, N] (class ids, 0-based without background:
line i of labels.txt names id i), `scores` [1, N], `count` [1] (how many of the N rows are detections). model.json
`outputs` names each role's tensor, so a model whose graph lists them in another order (TF2 and Model Maker
exports: scores, boxes, count, classes) reads the same. A box goes back to the original image through the
geometry preprocessing used (app/imaging/geometry.py Geometry: stretch, center crop or letterbox, a JPEG decoded at
reduced scale, EXIF orientation), is clipped to the image, and a box with nothing left inside it is dropped.

Options: `min_score`, `max_detections`, `labels` (only these classes; a label the model lacks is a 400 before any
work). Its native answer (`DetectResponse`): the model, the backend, the original image's size, `detections` best
first, the timings; front doors shape it for their protocols (DeepStack's, DOODS', Frigate's rows from
`box_normalized`). As named tensors (OIP v2): each role's tensor as the model gave it (boxes, classes, scores, count).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, Field

from app.errors import ModelDirError, RequestError
from app.imaging.geometry import Geometry
from app.tasks.base import OutputRoles, Outputs, Task, Timing, Warmup

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

BOXES, CLASSES, SCORES, COUNT = "boxes", "classes", "scores", "count"


@dataclass(frozen=True)
class Box:
    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class DetectedObject:
    label: str
    class_id: int
    score: float
    box: Box              # the original image's pixels (as a viewer shows it)
    box_normalized: Box   # the same box as fractions of the original image's width and height


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int


@dataclass(frozen=True)
class Detection:
    """The task's result."""

    image: ImageSize  # the original image, as a viewer shows it: what the boxes are in
    detections: list[DetectedObject]  # best first


@dataclass(frozen=True)
class DetectOptions:
    min_score: float = 0.5               # objects scoring below it are left out
    max_detections: int | None = None    # at most this many, best first (None: all the model gives)
    labels: frozenset[str] | None = None  # only these classes (labels, or class ids' numbers)
    class_ids: frozenset[int] | None = None  # `labels` as the model's class ids (Task.ready)


class BoxOut(BaseModel):
    x_min: float = Field(description="the box's left edge")
    y_min: float = Field(description="its top edge (y grows downwards)")
    x_max: float = Field(description="its right edge")
    y_max: float = Field(description="its bottom edge")


class DetectedObjectOut(BaseModel):
    label: str = Field(description="the class's line in labels.txt; a class without a label: its id")
    class_id: int = Field(description="the model's class id (0-based, without background)")
    score: float
    box: BoxOut = Field(description="in the original image's pixels, as a viewer shows it (EXIF orientation applied)")
    box_normalized: BoxOut = Field(description="the same box as fractions of the original image's width and height")


class ImageSizeOut(BaseModel):
    width: int = Field(description="the original image's width, as a viewer shows it")
    height: int


class DetectResponse(BaseModel):
    model: str
    backend: str = Field(description="the backend that actually ran")
    image: ImageSizeOut
    detections: list[DetectedObjectOut] = Field(description="best first")
    timing_ms: Timing
    warmup: Warmup
    cold: bool = Field(description="true when this request paid its interpreter's first inference")


class DetectionTask(Task):
    name = "detection"
    roles = (BOXES, CLASSES, SCORES, COUNT)
    options = DetectOptions
    schema = DetectResponse

    def ready(self, options: DetectOptions, model_dir: ModelDir) -> DetectOptions:
        """The labels asked for as the model's class ids: a 400 for one it lacks, before any work."""
        if options.labels is None:
            return options
        return dataclasses.replace(options, class_ids=class_ids(model_dir, options.labels))

    def read(self, outputs: Outputs, options: DetectOptions) -> Detection:
        geometry = outputs.geometry
        found = objects(outputs.roles, outputs.tensors, geometry, outputs.model_dir.labels, options.min_score,
                        options.max_detections, options.class_ids)
        return Detection(ImageSize(geometry.width, geometry.height), found)

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        """The shapes TFLite_Detection_PostProcess gives, float32, N rows alike across boxes, classes and scores."""
        specs = roles.specs
        found = {role: f"{spec.name!r} {spec.dtype.name} {list(spec.shape)}" for role, spec in specs.items()}
        rows = specs[BOXES].shape[1] if len(specs[BOXES].shape) == 3 else None
        expected = {BOXES: (1, rows, 4), CLASSES: (1, rows), SCORES: (1, rows)}
        wrong = [role for role, shape in expected.items() if tuple(specs[role].shape) != shape or rows is None]
        if int(np.prod(specs[COUNT].shape)) != 1:
            wrong.append(COUNT)
        wrong += [role for role in self.roles if specs[role].dtype != np.float32 and role not in wrong]
        if wrong:
            raise ModelDirError(
                f"model {model_dir.name!r} (detection): a detector's outputs are TFLite_Detection_PostProcess's, "
                "float32 boxes [1, N, 4], classes [1, N], scores [1, N] and count [1]; model.json `outputs` names "
                + ", ".join(f"{role} {found[role]}" for role in self.roles)
                + f" (wrong: {', '.join(dict.fromkeys(wrong))})")


TASK = DetectionTask()


def label_of(class_id: int, labels: tuple[str, ...]) -> str:
    """Line class_id of labels.txt; an id without a label (a blank line, or past the end) is named by its number."""
    return (labels[class_id] if 0 <= class_id < len(labels) else "") or str(class_id)


def class_ids(model_dir: ModelDir, wanted: frozenset[str]) -> frozenset[int]:
    """The class ids the labels name (a label, or an id's number): a RequestError (400: the parameter is well
    formed, this model has no such class) for one the model lacks."""
    labels = model_dir.labels
    by_label = {label: i for i, label in enumerate(labels) if label}
    ids, unknown = set(), []
    for name in wanted:
        if name in by_label:
            ids.add(by_label[name])
        elif name.isdigit() and name.isascii():
            ids.add(int(name))
        else:
            unknown.append(name)
    if unknown:
        known = [label for label in labels if label]
        shown = ", ".join(known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "")
        raise RequestError(f"labels: model {model_dir.name!r} has no label {', '.join(sorted(unknown))}; its "
                               f"labels: {shown or 'none (name classes by id)'}")
    return frozenset(ids)


def objects(roles: OutputRoles, outputs: list[np.ndarray], geometry: Geometry, labels: tuple[str, ...],
            min_score: float, max_detections: int | None = None,
            wanted: frozenset[int] | None = None) -> list[DetectedObject]:
    """The op's rows -> objects, best first: the first `count` rows scoring at least min_score, their boxes in
    the original image's pixels (clipped; a box with no area left is dropped), in `wanted` classes only."""
    boxes = roles.of(outputs, BOXES).reshape(-1, 4)
    n = boxes.shape[0]
    count = float(roles.of(outputs, COUNT).reshape(-1)[0])
    count = int(min(max(count, 0.0), n)) if np.isfinite(count) else 0
    scores = roles.of(outputs, SCORES).reshape(-1)[:count].astype(np.float64)
    classes = roles.of(outputs, CLASSES).reshape(-1)[:count]
    keep = np.flatnonzero(scores >= min_score)  # NaN never passes
    if wanted is not None:
        ids = np.where(np.isfinite(classes[keep]), classes[keep], -1).astype(np.int64)
        keep = keep[np.isin(ids, list(wanted))]
    if keep.size == 0:
        return []
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    ymin, xmin, ymax, xmax = boxes[keep].astype(np.float64).T
    (left, right), (top, bottom) = geometry.to_original(np.stack([xmin, xmax]), np.stack([ymin, ymax]))
    width, height = geometry.width, geometry.height
    left, right = np.clip(left, 0, width), np.clip(right, 0, width)
    top, bottom = np.clip(top, 0, height), np.clip(bottom, 0, height)
    inside = (right > left) & (bottom > top)  # NaN coordinates fail this too
    found = []
    for i in np.flatnonzero(inside).tolist()[:max_detections]:
        cls = classes[keep[i]]
        class_id = int(cls) if np.isfinite(cls) else -1
        x0, y0, x1, y1 = float(left[i]), float(top[i]), float(right[i]), float(bottom[i])
        found.append(DetectedObject(label_of(class_id, labels), class_id, float(scores[keep[i]]), Box(x0, y0, x1, y1),
                                    Box(x0 / width, y0 / height, x1 / width, y1 / height)))
    return found
