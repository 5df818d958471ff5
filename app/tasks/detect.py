"""Detection: a detector's outputs -> objects with labels, scores and boxes in the original image's pixels.

model.json `detection.decoder` says how the outputs become rows (boxes as ymin, xmin, ymax, xmax normalized to
the model's input, class ids from 0 without background: line i of labels.txt names id i, scores), and `outputs`
names, by role, the tensors it reads (app/model_dir/schema.py DetectionSpec):
- `postprocess` (no `detection` in model.json: SSD, EfficientDet-Lite): TFLite_Detection_PostProcess's outputs,
  `boxes` [1, N, 4], `classes` [1, N], `scores` [1, N], `count` [1], named by role so that a graph listing them
  in another order (TF2 and Model Maker exports: scores, boxes, count, classes) reads the same;
- `yolo` (Ultralytics' one tensor `predictions`) and `yolo_dfl` (the Coral layout's `class_logits` and
  `box_distributions`): decoded here on the CPU in numpy, the same on every backend (app/tasks/yolo.py, with NMS
  from app/tasks/nms.py);
- `priors` (face detectors: ULFD, RetinaFace): `boxes` [1, N, 4] against N prior boxes (raw locations, or corners
  an is_test=True export decoded), `scores` [1, N, 2] (column 1 the face), and with `landmarks` their offsets
  [1, N, 2L]: decoded here in numpy (app/tasks/priors.py), the priors made once per model (built in at the input's
  size, or the model directory's anchor file). An object of such a detector carries its landmarks (x, y in the
  original image's pixels, not clipped: a face at the edge keeps its eyes where they are).
The roles are bound at load from the model's decoder (DetectionTask.bind). A box goes back to the original image
through the geometry preprocessing used (app/imaging/geometry.py Geometry: stretch, center crop or letterbox, a
JPEG decoded at reduced scale, EXIF orientation), is clipped to the image, and a box with nothing left inside it
is dropped.

Options: `min_score`, `max_detections` (None: the model's, model.json `detection`; without them all the rows the
op gives, scoring at least the front door's default), `labels` (only these classes, separated by commas; a label
the model lacks is a 400 before any work). Its result (`Detection`): the original image's size, `detections` best
first (`LandmarkedObject`s, with their points, from a detector that gives landmarks); every front door reads it and
shapes it for its protocol (the native JSON as it is, DeepStack's pixels, DOODS' fractions and percents, Frigate's
rows from `box_normalized`). As named tensors (OIP v2): the post-process op's four tensors as the model gave them;
a YOLO head's or a priors detector's decoded into the same four, `boxes` [K, 4], `classes` [K], `scores` [K] and
`count` [1], FP32, K its max_detections, at its model.json thresholds, rows past `count` zero (and `landmarks`
[K, L, 2], (x, y) normalized to the input, for a detector that gives them).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.errors import ModelDirError, RequestError
from app.imaging.geometry import Geometry
from app.model_dir.schema import ANCHORS, ANCHORS_IN_FILE, LANDMARKS, POSTPROCESS, PRIORS, YOLO, DetectionSpec
from app.tasks import priors as prior_boxes
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
class Point:
    x: float
    y: float


@dataclass(frozen=True)
class LandmarkedObject(DetectedObject):
    """An object of a detector that gives landmarks (RetinaFace's five: eyes, nose tip, mouth corners, left to
    right as the image shows them), in the original image's pixels, not clipped."""

    landmarks: Annotated[tuple[Point, ...], Field(description=(
        "only from a detector that gives landmarks (a RetinaFace-style face detector: eyes, nose tip, mouth corners, "
        "left to right as the image shows them), in the original image's pixels, not clipped to it; absent "
        "otherwise"))]


@dataclass(frozen=True)
class Detection:
    """The objects in the original image, best first."""

    image: OriginalImage
    detections: Annotated[list[LandmarkedObject | DetectedObject], Field(description="best first")]


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

    # -- read, check and named_values below, by decoder

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
        landmarks = None
        if spec.decoder == POSTPROCESS:
            rows = postprocess_rows(outputs.roles, outputs.tensors)
        elif spec.decoder == PRIORS:
            rows, landmarks = decode_priors(outputs, spec, min_score, None if options.class_ids is not None else limit)
        else:  # with a class filter, NMS keeps what it keeps and the filter and the limit come after, as for the op
            rows = decode(outputs, spec, min_score, None if options.class_ids is not None else limit)
        found = objects_of(rows, geometry, outputs.model_dir.labels, min_score, limit, options.class_ids, landmarks)
        return Detection(ImageSize(geometry.width, geometry.height), found)

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        """The tensors the model's decoder reads have the shapes and types it needs: ModelDirError naming them."""
        spec = model_dir.manifest.detection_spec()
        if spec.decoder == POSTPROCESS:
            _check_postprocess(model_dir, roles)
        elif spec.decoder == PRIORS:
            _check_priors(model_dir, roles, spec)
        else:
            _check_yolo(model_dir, roles, spec)

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        spec = outputs.model_dir.manifest.detection_spec()
        if spec.decoder == POSTPROCESS:
            return super().named_values(outputs)
        if spec.decoder == PRIORS:
            rows, landmarks = decode_priors(outputs, spec, spec.min_score, spec.max_detections)
            return decoded_values(rows, spec.max_detections, landmarks, spec.landmarks)
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


def _check_priors(model_dir: ModelDir, roles: OutputRoles, spec: DetectionSpec) -> None:
    """A prior-box detector's tensors: 8-bit (quantized) or float32, boxes [1, N, 4], scores [1, N, 2] (landmarks
    [1, N, 2L]) with N its priors at its input size; the anchor file's variances model.json's."""
    specs = roles.specs
    found = ", ".join(f"{role} {s.name!r} {s.dtype.name} {list(s.shape)}" for role, s in specs.items())
    where = f"model {model_dir.name!r} (detection, decoder 'priors'): model.json `outputs` names {found}"
    wrong = [f"{role} is {s.dtype.name}" for role, s in specs.items()
             if s.dtype not in (*EIGHT_BIT, np.dtype(np.float32)) or (s.dtype in EIGHT_BIT and not s.scale > 0)]
    if wrong:
        raise ModelDirError(f"{where}: {'; '.join(wrong)}")
    priors = model_priors(model_dir, spec)
    landmarks = specs[LANDMARKS].shape if LANDMARKS in specs else None
    try:
        prior_boxes.check_outputs(priors, specs["boxes"].shape, specs["scores"].shape, landmarks)
    except prior_boxes.PriorsError as e:
        raise ModelDirError(f"{where}: {e} (detection.anchors {spec.anchors!r})") from None
    if landmarks is not None and landmarks[2] != 2 * spec.landmarks:
        raise ModelDirError(f"{where}: detection.landmarks {spec.landmarks} needs landmarks [1, N, "
                            f"{2 * spec.landmarks}]")


def model_priors(model_dir: ModelDir, spec: DetectionSpec) -> prior_boxes.Priors:
    """The priors of a prior-box detector at its input size, with model.json's variances: made once per model
    (and anchor file), kept for its requests. The anchor file's sha256 is checked when they are made."""
    size = model_dir.manifest.input
    entry = model_dir.manifest.files.get(ANCHORS) if spec.anchors == ANCHORS_IN_FILE else None
    anchor_file = (str(model_dir.path / entry.path), entry.sha256) if entry is not None else None
    return _priors(model_dir.name, spec.anchors, anchor_file, size.width, size.height, tuple(spec.variances))


@functools.lru_cache(maxsize=64)
def _priors(model: str, anchors: str, anchor_file: tuple[str, str] | None, width: int, height: int,
            variances: tuple[float, float]) -> prior_boxes.Priors:
    """The priors by what makes them: a built-in set, or an anchor file by its path and sha256 (a reload's new
    file, or a changed one, makes new ones)."""
    try:
        if anchors != ANCHORS_IN_FILE:
            anchor_spec = prior_boxes.BUILT_IN[anchors]
        elif anchor_file is None:
            raise ModelDirError(f"model {model!r}: detection.anchors 'file' but model.json lists no {ANCHORS!r} file")
        else:
            path, sha256 = anchor_file
            try:
                data = Path(path).read_bytes()
            except OSError as e:
                raise ModelDirError(f"model {model!r}: cannot read its anchor file {path}: {e}") from None
            if hashlib.sha256(data).hexdigest() != sha256:
                raise ModelDirError(f"model {model!r}: its anchor file {path} is not the one model.json lists (sha256 "
                                    f"{sha256}): the file was changed after the import; import the model again")
            anchor_spec = prior_boxes.anchors_of(data, path)
        if (anchor_spec.center_variance, anchor_spec.size_variance) != variances:
            if anchors == ANCHORS_IN_FILE:
                raise ModelDirError(f"model {model!r}: its anchor file's variances are "
                                    f"{[anchor_spec.center_variance, anchor_spec.size_variance]}, model.json's "
                                    f"detection.variances {list(variances)}: import it again")
            anchor_spec = dataclasses.replace(anchor_spec, center_variance=variances[0], size_variance=variances[1])
        return anchor_spec.for_input(width, height).priors()
    except prior_boxes.PriorsError as e:
        raise ModelDirError(f"model {model!r}: {e}") from None


def decode_priors(outputs: Outputs, spec: DetectionSpec, min_score: float,
                  max_detections: int | None) -> tuple[Rows, np.ndarray | None]:
    """A prior-box detector's tensors -> its rows (class 0, the face) and their landmarks [K, L, 2] (x, y
    normalized to the input; None without them); max_detections None: every box NMS keeps."""
    def real(role: str) -> np.ndarray:
        tensor, tensor_spec = outputs.of(role), outputs.spec(role)
        quantized = tensor_spec.dtype in EIGHT_BIT
        return prior_boxes.dequantize(tensor, (tensor_spec.scale, tensor_spec.zero_point) if quantized else None)

    faces = prior_boxes.decode_faces(
        real("boxes"), real("scores"), model_priors(outputs.model_dir, spec), min_score=min_score,
        iou_threshold=spec.nms_iou, max_detections=max_detections, form=spec.box_encoding,
        scores_are=prior_boxes.LOGITS if spec.score_activation == "softmax" else prior_boxes.PROBABILITIES,
        landmarks=real(LANDMARKS) if spec.landmarks else None)
    return Rows(faces.boxes, np.zeros(len(faces), np.int64), faces.scores), faces.landmarks


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
    """A decoder's named outputs (OIP v2): its rows as the post-process op gives its own, K = max_detections (and
    the landmarks [K, L, 2] of a detector that gives them)."""
    rows, f32 = spec.max_detections, np.dtype(np.float32)
    named = [NamedOutput(BOXES, f32, (rows, 4)), NamedOutput(CLASSES, f32, (rows,)),
             NamedOutput(SCORES, f32, (rows,)), NamedOutput(COUNT, f32, (1,))]
    if spec.decoder == PRIORS and spec.landmarks:
        named.append(NamedOutput(LANDMARKS, f32, (rows, spec.landmarks, 2)))
    return named


def decoded_values(rows: Rows, size: int, landmarks: np.ndarray | None = None,
                   points: int | None = None) -> dict[str, np.ndarray]:
    """Rows padded with zeros to `size`, as decoded_outputs() names them (the landmarks [K, points, 2] too)."""
    count = min(len(rows), size)
    boxes, classes, scores = np.zeros((size, 4), np.float32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    boxes[:count], classes[:count], scores[:count] = rows.boxes[:count], rows.classes[:count], rows.scores[:count]
    values = {BOXES: boxes, CLASSES: classes, SCORES: scores, COUNT: np.array([count], np.float32)}
    if points:
        values[LANDMARKS] = np.zeros((size, points, 2), np.float32)
        if landmarks is not None:
            values[LANDMARKS][:count] = landmarks[:count]
    return values


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
               max_detections: int | None = None, wanted: frozenset[int] | None = None,
               landmarks: np.ndarray | None = None) -> list[DetectedObject]:
    """Rows -> objects, best first: those scoring at least min_score, their boxes in the original image's pixels
    (clipped; a box with no area left is dropped), in `wanted` classes only, at most max_detections; with the
    rows' landmarks ([K, L, 2], (x, y) normalized to the input), LandmarkedObjects, their points mapped alike."""
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
    points = None
    if landmarks is not None:
        xs, ys = geometry.to_original(landmarks[keep, :, 0], landmarks[keep, :, 1])
        points = np.stack([xs, ys], -1).tolist()
    found = []
    for i in np.flatnonzero(inside).tolist()[:max_detections]:
        class_id = int(rows.classes[keep[i]])
        x0, y0, x1, y1 = float(left[i]), float(top[i]), float(right[i]), float(bottom[i])
        fields = (label_of(class_id, labels), class_id, float(scores[keep[i]]), Box(x0, y0, x1, y1),
                  Box(x0 / width, y0 / height, x1 / width, y1 / height))
        if points is None:
            found.append(DetectedObject(*fields))
        else:
            found.append(LandmarkedObject(*fields, tuple(Point(x, y) for x, y in points[i])))
    return found
