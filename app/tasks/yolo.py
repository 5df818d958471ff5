"""YOLO heads decoded on the CPU in numpy: a model's raw output tensors -> the rows TFLite_Detection_PostProcess
gives (boxes as ymin, xmin, ymax, xmax normalized to the model's input, class ids, scores, best first), so the
detection task treats every detector the same after this step, on every backend.

Two layouts (model.json `detection.decoder`, app/model_dir/schema.py DetectionSpec):

- `yolo`, Ultralytics' one tensor (v8, v11 and later; YOLOv5 with `objectness`): [1, 4 + C, N]
  (`attributes_first`, the export's own layout) or [1, N, 4 + C] (`anchors_first`); per candidate a box, then
  C class scores (YOLOv5: a box, an objectness, then C class scores; the score is objectness x class score).
  The box is xywh (centre and size) or xyxy, in fractions of the input (`normalized`: Ultralytics' TFLite
  exports divide by the image size) or in its pixels. Class scores come as probabilities (`none`, the
  export applies the sigmoid) or logits (`sigmoid`).
- `yolo_dfl`, the Coral layout Frigate serves (its `yolo-generic` model type): class logits [1, N, C] and
  DFL box distributions [1, N, 4 x reg_max]. Anchors are the grid cells' centres (cell + 0.5) of each stride
  in turn, row by row; per side (left, top, right, bottom) a softmax over reg_max bins gives the expected
  distance d in cells, and the box is x1y1 = (anchor - d_lt) x stride, x2y2 = (anchor + d_rb) x stride, in
  input pixels; the score is the sigmoid of the best class logit.

Each decoder dequantizes as TFLite's DEQUANTIZE does (float32(scale x (q - zero_point))) and only what it
needs: the best class score of every candidate is found on the quantized values (dequantization and the
sigmoid are monotonic), turned into a score through a 256-entry table, and compared with min_score; only
the candidates that pass have their class, box (the DFL softmax) and score worked out. Then greedy NMS
(app/tasks/nms.py), class-aware or class-agnostic, keeps at most max_detections, best first; equal scores
go in candidate order. Nothing here knows a request, an engine or a front door.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from app.model_dir.schema import POSTPROCESS, YOLO, YOLO_DFL, DetectionSpec, grid_cells
from app.tasks.nms import non_max_suppression

BOX_SIDES = 4
# the decoders' roles (model.json `outputs`), app/model_dir/schema.py DECODER_ROLES
PREDICTIONS = "predictions"
CLASS_LOGITS, BOX_DISTRIBUTIONS = "class_logits", "box_distributions"


class DecodeError(ValueError):
    """The tensors do not have the layout the model's `detection` says (a shape or a parameter that does not fit)."""


@dataclass(frozen=True)
class Raw:
    """One output tensor as the model gave it: its values and, for an 8-bit tensor, its quantization."""

    values: np.ndarray
    scale: float | None = None
    zero_point: int | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None and self.values.dtype in (np.int8, np.uint8)

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        """Some of its values as real numbers, float64 of TFLite's float32 DEQUANTIZE."""
        if not self.quantized:
            return np.asarray(values, np.float32).astype(np.float64)
        real = np.float64(np.float32(self.scale)) * (values.astype(np.int64) - int(self.zero_point))
        return real.astype(np.float32).astype(np.float64)


@dataclass(frozen=True)
class Rows:
    """Detections as TFLite_Detection_PostProcess gives them, best first: boxes [K, 4] (ymin, xmin, ymax, xmax,
    normalized to the model's input, not clipped), class ids [K] (from 0) and scores [K]."""

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray

    @classmethod
    def empty(cls) -> Rows:
        return cls(np.zeros((0, BOX_SIDES), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))

    def __len__(self) -> int:
        return len(self.scores)


def decode(spec: DetectionSpec, outputs: Mapping[str, Raw], width: int, height: int,
           min_score: float | None = None, max_detections: int | None = None) -> Rows:
    """The model's tensors by role -> its detections scoring at least min_score, at most max_detections (both
    model.json's when not given). `width` x `height`: the model's input."""
    min_score = spec.min_score if min_score is None else min_score
    max_detections = spec.max_detections if max_detections is None else max_detections
    if spec.decoder == YOLO:
        return decode_yolo(spec, outputs[PREDICTIONS], width, height, min_score, max_detections)
    if spec.decoder == YOLO_DFL:
        return decode_yolo_dfl(spec, outputs[CLASS_LOGITS], outputs[BOX_DISTRIBUTIONS], width, height, min_score,
                               max_detections)
    raise DecodeError(f"the {POSTPROCESS!r} decoder is the model's own op: its rows need no decoding here")


# ---- scores ----------------------------------------------------------------------------------------------

def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _activation(values: np.ndarray, activation: str) -> np.ndarray:
    return sigmoid(values) if activation == "sigmoid" else values


@lru_cache(maxsize=64)
def _score_table(dtype: str, scale: float, zero_point: int, activation: str) -> np.ndarray:
    """The score of each quantized value of an 8-bit tensor, indexed by the value's unsigned byte."""
    low = -128 if dtype == "int8" else 0
    q = np.arange(low, low + 256)
    table = _activation(Raw(q.astype(dtype), scale, zero_point).dequantize(q), activation)
    if dtype == "int8":
        table = np.roll(table, -128)  # index by the byte: 0..127 are 0..127, 128..255 are -128..-1
    table.setflags(write=False)
    return table


def scores_of(raw: Raw, values: np.ndarray, activation: str) -> np.ndarray:
    """Scores of some of a tensor's values (quantized or float), float64."""
    if raw.quantized:
        table = _score_table(raw.values.dtype.name, float(raw.scale), int(raw.zero_point), activation)
        return table[values.view(np.uint8) if values.dtype == np.int8 else values]
    return _activation(raw.dequantize(values), activation)


def _candidates(best: np.ndarray, min_score: float) -> np.ndarray:
    """The candidates whose score passes min_score (NaN never passes)."""
    return np.flatnonzero(best >= min_score)


def _keep(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, spec: DetectionSpec,
          max_detections: int) -> Rows:
    kept = non_max_suppression(boxes, scores, spec.nms_iou, None if spec.class_agnostic else classes,
                               max_detections)
    return Rows(boxes[kept].astype(np.float32), classes[kept].astype(np.int64), scores[kept].astype(np.float32))


# ---- Ultralytics' one tensor -------------------------------------------------------------------------------

def yolo_attributes(spec: DetectionSpec) -> int:
    """Values per candidate: the box, YOLOv5's objectness, the class scores."""
    return BOX_SIDES + int(bool(spec.objectness)) + spec.classes


def yolo_table(spec: DetectionSpec, raw: Raw) -> np.ndarray:
    """The tensor as [attributes, N] (a view: the export's own layout) or [N, attributes]."""
    attributes = yolo_attributes(spec)
    values = raw.values
    if values.size % attributes:
        raise DecodeError(f"a yolo tensor of shape {list(values.shape)} does not hold {attributes} values "
                          f"({BOX_SIDES} box, {int(bool(spec.objectness))} objectness, {spec.classes} classes) "
                          "per candidate")
    if spec.layout == "attributes_first":
        return values.reshape(attributes, -1)
    return values.reshape(-1, attributes)


def decode_yolo(spec: DetectionSpec, raw: Raw, width: int, height: int, min_score: float,
                max_detections: int) -> Rows:
    """Ultralytics' single tensor -> rows (see the module's docstring)."""
    table = yolo_table(spec, raw)
    first = spec.layout == "attributes_first"
    column = (lambda i: table[i]) if first else (lambda i: table[:, i])  # noqa: E731: one attribute, all candidates
    start = BOX_SIDES + int(bool(spec.objectness))
    classes = table[start:] if first else table[:, start:]
    best = scores_of(raw, classes.max(axis=0 if first else 1), spec.score_activation)
    if spec.objectness:
        best = scores_of(raw, column(BOX_SIDES), spec.score_activation) * best
    picked = _candidates(best, min_score)
    if picked.size == 0:
        return Rows.empty()
    chosen = classes[:, picked] if first else classes[picked]
    class_ids = np.argmax(chosen, axis=0 if first else 1)
    a, b, c, d = (raw.dequantize(column(i)[picked]) for i in range(BOX_SIDES))
    if spec.box_format == "xywh":
        x1, y1, x2, y2 = a - c / 2, b - d / 2, a + c / 2, b + d / 2
    else:
        x1, y1, x2, y2 = a, b, c, d
    if spec.box_scale == "pixels":
        x1, x2, y1, y2 = x1 / width, x2 / width, y1 / height, y2 / height
    boxes = np.stack([y1, x1, y2, x2], axis=1)
    return _keep(boxes, best[picked], class_ids, spec, max_detections)


# ---- the Coral/Frigate DFL pair -----------------------------------------------------------------------------

@lru_cache(maxsize=16)
def anchors(width: int, height: int, strides: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every anchor of the grids, stride by stride, row by row: its centre (x, y) in cells (cell + 0.5) [N, 2]
    and its stride [N] (a grid has height // stride rows and width // stride columns)."""
    points, steps = [], []
    for stride in strides:
        rows, cols = height // stride, width // stride
        y, x = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
        points.append(np.stack([x.ravel(), y.ravel()], axis=1) + 0.5)
        steps.append(np.full(rows * cols, float(stride)))
    centres, per_anchor = np.concatenate(points), np.concatenate(steps)
    centres.setflags(write=False)
    per_anchor.setflags(write=False)
    return centres, per_anchor


def anchor_count(width: int, height: int, strides: Sequence[int]) -> int:
    return grid_cells(width, height, strides)


def dfl_distances(distributions: np.ndarray, reg_max: int) -> np.ndarray:
    """[K, 4 x reg_max] real bin logits -> [K, 4] expected distances in cells: per side a softmax over its bins,
    then the bins' expectation."""
    bins = distributions.reshape(-1, BOX_SIDES, reg_max)
    exp = np.exp(bins - bins.max(axis=2, keepdims=True))
    return (exp @ np.arange(reg_max, dtype=np.float64)) / exp.sum(axis=2)


def decode_yolo_dfl(spec: DetectionSpec, logits: Raw, distributions: Raw, width: int, height: int,
                    min_score: float, max_detections: int) -> Rows:
    """Class logits [1, N, C] and DFL distributions [1, N, 4 x reg_max] -> rows (see the module's docstring)."""
    strides = tuple(spec.strides)
    centres, steps = anchors(width, height, strides)
    n = len(steps)
    if logits.values.size != n * spec.classes or distributions.values.size != n * BOX_SIDES * spec.reg_max:
        raise DecodeError(
            f"class logits {list(logits.values.shape)} and box distributions {list(distributions.values.shape)} "
            f"do not fit {n} anchors (strides {list(strides)} at {width}x{height}), {spec.classes} classes and "
            f"reg_max {spec.reg_max}")
    table = logits.values.reshape(n, spec.classes)
    best = scores_of(logits, table.max(axis=1), spec.score_activation)
    picked = _candidates(best, min_score)
    if picked.size == 0:
        return Rows.empty()
    class_ids = np.argmax(table[picked], axis=1)
    bins = distributions.dequantize(distributions.values.reshape(n, -1)[picked])
    left, top, right, bottom = dfl_distances(bins, spec.reg_max).T
    (x, y), stride = centres[picked].T, steps[picked]
    x1, y1 = (x - left) * stride / width, (y - top) * stride / height
    x2, y2 = (x + right) * stride / width, (y + bottom) * stride / height
    boxes = np.stack([y1, x1, y2, x2], axis=1)
    return _keep(boxes, best[picked], class_ids, spec, max_detections)
