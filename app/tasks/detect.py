"""Detection: a detector's outputs -> objects with labels, scores and boxes in the original image's pixels.

model.json `detection.decoder` says how the outputs become rows (boxes as ymin, xmin, ymax, xmax normalized to
the model's input, class ids from 0 without background: line i of labels.txt names id i, scores), and `outputs`
names, by role, the tensors it reads (app/model_dir/schema.py DetectionSpec):
- `postprocess` (no `detection` in model.json: SSD, EfficientDet-Lite): TFLite_Detection_PostProcess's outputs,
  `boxes` [1, N, 4], `classes` [1, N], `scores` [1, N], `count` [1], named by role so that a graph listing them
  in another order (TF2 and Model Maker exports: scores, boxes, count, classes) reads the same;
- `yolo` (Ultralytics' one tensor `predictions`) and `yolo_dfl` (the Coral layout's `class_logits` and
  `box_distributions`): decoded here on the CPU in numpy, the same on every backend (app/tasks/yolo.py, with NMS
  from app/tasks/nms.py).
The roles are bound at load from the model's decoder (DetectionTask.bind). A box goes back to the original image
through the geometry preprocessing used (app/imaging/geometry.py Geometry: stretch, center crop or letterbox, a
JPEG decoded at reduced scale, EXIF orientation), is clipped to the image, and a box with nothing left inside it
is dropped.

Options: `min_score`, `max_detections` (None: the model's, model.json `detection`; without them all the rows the
op gives, scoring at least the front door's default), `labels` (only these classes, separated by commas; a label
the model lacks is a 400 before any work). Its result (`Detection`): the original image's size, `detections` best
first; every front door reads it and shapes it for its protocol (the native JSON as it is, DeepStack's pixels,
DOODS' fractions and percents, Frigate's rows from `box_normalized`). As named tensors (OIP v2): the post-process op's four tensors as the model gave them;
a YOLO head's decoded into the same four, `boxes` [K, 4], `classes` [K], `scores` [K] and `count` [1], FP32, K
its max_detections, at its model.json thresholds, rows past `count` zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.errors import ModelDirError, RequestError
from app.imaging.geometry import Geometry
from app.model_dir.schema import POSTPROCESS, YOLO, DetectionSpec
from app.tasks import yolo
from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task, resolve_roles
from app.tasks.results import ClassId, ImageSize, Internal, Label, OriginalImage, label_of
from app.tasks.yolo import Raw, Rows

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

BOXES, CLASSES, SCORES, COUNT = "boxes", "classes", "scores", "count"
# the front doors' default threshold for a model whose model.json sets none (/v1/detect's; DeepStack's is its own)
DEFAULT_MIN_SCORE = 0.5
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
EVERY_KEPT = 1 << 62  # a YOLO decode's limit when a class filter comes after it: every box NMS keeps
# Fixed, part of the API's schema and checked before any work (docs/configuration.md's fixed limits): a detector
# gives at most its own N rows (100 for the SSD detectors); `labels` URL-encoded is at most 12 bytes a character,
# well inside the 16 KiB head cap.
MAX_DETECTIONS = 1000
MAX_LABELS_CHARS = 512


@dataclass(frozen=True)
class Box:
    x_min: Annotated[float, Field(description="the box's left edge")]
    y_min: Annotated[float, Field(description="its top edge (y grows downwards)")]
    x_max: Annotated[float, Field(description="its right edge")]
    y_max: Annotated[float, Field(description="its bottom edge")]


@dataclass(frozen=True)
class DetectedObject:
    label: Label
    class_id: ClassId
    score: float
    box: Annotated[Box, Field(description="in the original image's pixels, as a viewer shows it (EXIF orientation "
                                          "applied)")]
    box_normalized: Annotated[Box, Field(description="the same box as fractions of the original image's width and "
                                                     "height")]


@dataclass(frozen=True)
class Detection:
    """The objects in the original image, best first."""

    image: OriginalImage
    detections: Annotated[list[DetectedObject], Field(description="best first")]


@dataclass(frozen=True)
class DetectOptions:
    min_score: Annotated[float | None, Field(ge=0.0, le=1.0, description=(
        "drop objects scoring below this (default: the model's, model.json detection.min_score, else 0.5)"))] = None
    max_detections: Annotated[int | None, Field(ge=1, le=MAX_DETECTIONS, description=(
        "at most this many objects, best first (default: the model's, model.json detection.max_detections, else "
        "all the model gives)"))] = None
    labels: Annotated[str | None, Field(max_length=MAX_LABELS_CHARS, description=(
        "keep only these classes: labels (or class ids) separated by commas, e.g. person,car"))] = None
    # `labels` as the model's class ids (Task.ready); the front door's threshold for a model that sets none
    class_ids: Annotated[frozenset[int] | None, Internal] = None
    default_min_score: Annotated[float, Internal] = DEFAULT_MIN_SCORE


@dataclass(frozen=True)
class _DecoderRoles:
    """The roles a model's decoder reads, where app.tasks.base.resolve_roles looks for a task's."""

    name: str
    roles: tuple[str, ...]


class DetectionTask(Task, name="detection", verb="detect", summary="Detect objects"):
    roles = (BOXES, CLASSES, SCORES, COUNT)  # the post-process op's; a YOLO decoder's are bound per model (bind)

    def bind(self, model_dir: ModelDir, outputs) -> OutputRoles:
        """At load: the roles of the model's decoder (model.json `detection`), resolved by name and checked."""
        spec = model_dir.manifest.detection_spec()
        roles = resolve_roles(_DecoderRoles(self.name, spec.roles), model_dir, outputs)
        self.check(model_dir, roles)
        if spec.decoder == POSTPROCESS:
            return dataclasses.replace(roles, named=tuple(self.named_outputs(roles)))
        return dataclasses.replace(roles, named=tuple(decoded_outputs(spec)))

    def ready(self, options: DetectOptions, model_dir: ModelDir) -> DetectOptions:
        """The labels asked for as the model's class ids: a 400 for one it lacks, before any work."""
        wanted = wanted_labels(options.labels)
        if wanted is None:
            return options
        return dataclasses.replace(options, class_ids=class_ids(model_dir, wanted))

    def read(self, outputs: Outputs, options: DetectOptions) -> Detection:
        geometry = outputs.geometry
        spec = outputs.model_dir.manifest.detection_spec()
        min_score = options.min_score
        if min_score is None:
            min_score = spec.min_score if spec.min_score is not None else options.default_min_score
        limit = options.max_detections or spec.max_detections
        if spec.decoder == POSTPROCESS:
            rows = postprocess_rows(outputs.roles, outputs.tensors)
        else:  # with a class filter, NMS keeps what it keeps and the filter and the limit come after, as for the op
            rows = decode(outputs, spec, min_score, None if options.class_ids is not None else limit)
        found = objects_of(rows, geometry, outputs.model_dir.labels, min_score, limit, options.class_ids)
        return Detection(ImageSize(geometry.width, geometry.height), found)

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        """The tensors the model's decoder reads have the shapes and types it needs: ModelDirError naming them."""
        spec = model_dir.manifest.detection_spec()
        if spec.decoder == POSTPROCESS:
            _check_postprocess(model_dir, roles)
        else:
            _check_yolo(model_dir, roles, spec)

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        spec = outputs.model_dir.manifest.detection_spec()
        if spec.decoder == POSTPROCESS:
            return super().named_values(outputs)
        return decoded_values(decode(outputs, spec, spec.min_score, spec.max_detections), spec.max_detections)


def _check_postprocess(model_dir: ModelDir, roles: OutputRoles) -> None:
    """The shapes TFLite_Detection_PostProcess gives, float32, N rows alike across boxes, classes and scores."""
    specs = roles.specs
    found = {role: f"{spec.name!r} {spec.dtype.name} {list(spec.shape)}" for role, spec in specs.items()}
    rows = specs[BOXES].shape[1] if len(specs[BOXES].shape) == 3 else None
    expected = {BOXES: (1, rows, 4), CLASSES: (1, rows), SCORES: (1, rows)}
    wrong = [role for role, shape in expected.items() if tuple(specs[role].shape) != shape or rows is None]
    if int(np.prod(specs[COUNT].shape)) != 1:
        wrong.append(COUNT)
    wrong += [role for role in TASK.roles if specs[role].dtype != np.float32 and role not in wrong]
    if wrong:
        raise ModelDirError(
            f"model {model_dir.name!r} (detection): a detector's outputs are TFLite_Detection_PostProcess's, "
            "float32 boxes [1, N, 4], classes [1, N], scores [1, N] and count [1]; model.json `outputs` names "
            + ", ".join(f"{role} {found[role]}" for role in TASK.roles)
            + f" (wrong: {', '.join(dict.fromkeys(wrong))})")


def _check_yolo(model_dir: ModelDir, roles: OutputRoles, spec: DetectionSpec) -> None:
    """A YOLO head's tensors: 8-bit (quantized) or float32, shaped as model.json `detection` says at its input."""
    specs = roles.specs
    size = model_dir.manifest.input
    found = ", ".join(f"{role} {s.name!r} {s.dtype.name} {list(s.shape)}" for role, s in specs.items())
    problems = [f"{role} is {s.dtype.name}" for role, s in specs.items()
                if s.dtype not in (*EIGHT_BIT, np.dtype(np.float32)) or (s.dtype in EIGHT_BIT and not s.scale > 0)]
    if spec.decoder == YOLO:
        shape = tuple(specs[yolo.PREDICTIONS].shape)
        attributes = yolo.yolo_attributes(spec)
        at = 1 if spec.layout == "attributes_first" else 2
        if len(shape) != 3 or shape[0] != 1 or shape[at] != attributes:
            layout = "[1, A, N]" if at == 1 else "[1, N, A]"
            problems.append(f"predictions must be {layout} with A = {attributes} (4 box values"
                            f"{', an objectness' if spec.objectness else ''} and {spec.classes} classes)")
    else:
        n = yolo.anchor_count(size.width, size.height, spec.strides)
        logits, bins = tuple(specs[yolo.CLASS_LOGITS].shape), tuple(specs[yolo.BOX_DISTRIBUTIONS].shape)
        if logits != (1, n, spec.classes) or bins != (1, n, 4 * spec.reg_max):
            problems.append(f"at {size.width}x{size.height} with strides {spec.strides} there are {n} anchors: "
                            f"class_logits must be [1, {n}, {spec.classes}] and box_distributions "
                            f"[1, {n}, {4 * spec.reg_max}]")
    if problems:
        raise ModelDirError(f"model {model_dir.name!r} (detection, decoder {spec.decoder!r}): model.json `outputs` "
                            f"names {found}: {'; '.join(problems)}")


TASK = DetectionTask()


def wanted_labels(labels: str | None) -> frozenset[str] | None:
    """The labels of a `labels` option, "person,car": None for none."""
    if labels is None:
        return None
    return frozenset(name.strip() for name in labels.split(",") if name.strip()) or None


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


def decode(outputs: Outputs, spec: DetectionSpec, min_score: float, max_detections: int | None) -> Rows:
    """A YOLO head's tensors -> rows, at the model's input size; max_detections None: every box NMS keeps."""
    raw = {role: Raw(outputs.of(role), spec_.scale if spec_.dtype in EIGHT_BIT else None, spec_.zero_point)
           for role, spec_ in outputs.roles.specs.items()}
    size = outputs.model_dir.manifest.input
    return yolo.decode(spec, raw, size.width, size.height, min_score,
                       EVERY_KEPT if max_detections is None else max_detections)


def decoded_outputs(spec: DetectionSpec) -> list[NamedOutput]:
    """A YOLO head's named outputs (OIP v2): its rows as the post-process op gives its own, K = max_detections."""
    rows, f32 = spec.max_detections, np.dtype(np.float32)
    return [NamedOutput(BOXES, f32, (rows, 4)), NamedOutput(CLASSES, f32, (rows,)), NamedOutput(SCORES, f32, (rows,)),
            NamedOutput(COUNT, f32, (1,))]


def decoded_values(rows: Rows, size: int) -> dict[str, np.ndarray]:
    """Rows padded with zeros to `size`, as decoded_outputs() names them."""
    count = min(len(rows), size)
    boxes, classes, scores = np.zeros((size, 4), np.float32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    boxes[:count], classes[:count], scores[:count] = rows.boxes[:count], rows.classes[:count], rows.scores[:count]
    return {BOXES: boxes, CLASSES: classes, SCORES: scores, COUNT: np.array([count], np.float32)}


def postprocess_rows(roles: OutputRoles, outputs) -> Rows:
    """TFLite_Detection_PostProcess's first `count` rows (a class id that is no number becomes -1)."""
    boxes = roles.of(outputs, BOXES).reshape(-1, 4)
    n = boxes.shape[0]
    count = float(roles.of(outputs, COUNT).reshape(-1)[0])
    count = int(min(max(count, 0.0), n)) if np.isfinite(count) else 0
    classes = roles.of(outputs, CLASSES).reshape(-1)[:count]
    ids = np.where(np.isfinite(classes), classes, -1).astype(np.int64)
    return Rows(boxes[:count], ids, roles.of(outputs, SCORES).reshape(-1)[:count])


def objects(roles: OutputRoles, outputs: list[np.ndarray], geometry: Geometry, labels: tuple[str, ...],
            min_score: float, max_detections: int | None = None,
            wanted: frozenset[int] | None = None) -> list[DetectedObject]:
    """The post-process op's rows -> objects (objects_of)."""
    return objects_of(postprocess_rows(roles, outputs), geometry, labels, min_score, max_detections, wanted)


def objects_of(rows: Rows, geometry: Geometry, labels: tuple[str, ...], min_score: float,
               max_detections: int | None = None, wanted: frozenset[int] | None = None) -> list[DetectedObject]:
    """Rows -> objects, best first: those scoring at least min_score, their boxes in the original image's pixels
    (clipped; a box with no area left is dropped), in `wanted` classes only, at most max_detections."""
    scores = np.asarray(rows.scores, np.float64)
    keep = np.flatnonzero(scores >= min_score)  # NaN never passes
    if wanted is not None:
        keep = keep[np.isin(rows.classes[keep], list(wanted))]
    if keep.size == 0:
        return []
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    ymin, xmin, ymax, xmax = np.asarray(rows.boxes, np.float64)[keep].T
    (left, right), (top, bottom) = geometry.to_original(np.stack([xmin, xmax]), np.stack([ymin, ymax]))
    width, height = geometry.width, geometry.height
    left, right = np.clip(left, 0, width), np.clip(right, 0, width)
    top, bottom = np.clip(top, 0, height), np.clip(bottom, 0, height)
    inside = (right > left) & (bottom > top)  # NaN coordinates fail this too
    found = []
    for i in np.flatnonzero(inside).tolist()[:max_detections]:
        class_id = int(rows.classes[keep[i]])
        x0, y0, x1, y1 = float(left[i]), float(top[i]), float(right[i]), float(bottom[i])
        found.append(DetectedObject(label_of(class_id, labels), class_id, float(scores[keep[i]]), Box(x0, y0, x1, y1),
                                    Box(x0 / width, y0 / height, x1 / width, y1 / height)))
    return found
