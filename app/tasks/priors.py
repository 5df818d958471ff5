"""Prior boxes (SSD's default boxes) and their decode: face detectors whose raw outputs are box locations
[1, N, 4] against N priors and class scores [1, N, 2], Ultra-Light-Fast-Generic-Face-Detector (ULFD, RFB-320
and slim) first, and any anchor set a user hands in (`--anchors FILE.json`, docs/faces.md "Anchor files").

**The priors, as ULFD's `generate_priors` makes them** (vision/utils/box_utils.py, fd_config.py): for each
feature map in turn, row by row (y), then column by column (x), then each of its min sizes, one prior
(cx, cy, w, h) in fractions of the input: cx = (x + 0.5) / map width, cy = (y + 0.5) / map height,
w = min size / input width, h = min size / input height; then every value is clamped to [0, 1] (at 320x240
the 256-pixel prior's height, 256/240, becomes 1). A feature map is ceil(input / stride) a side (the
backbone's stride-2 convolutions with padding 1 halve a side rounding up), so 320x240 with strides 8, 16,
32, 64 gives 40x30, 20x15, 10x8 and 5x4 maps and N = 3*1200 + 2*300 + 2*80 + 3*20 = 4420; ULFD's own table
for 128 to 1280 pixels follows the same rule. Other inputs are generalised through the strides and min
sizes (`AnchorSpec.for_input`).

**The decode** (convert_locations_to_boxes, then center_form_to_corner_form): with variances 0.1 (centres) and
0.2 (sizes), cx = l0 * 0.1 * w + prior cx, cy = l1 * 0.1 * h + prior cy, w = exp(l2 * 0.2) * prior w,
h = exp(l3 * 0.2) * prior h, then corners cx -/+ w / 2, cy -/+ h / 2, clipped to [0, 1] as ULFD's TFLite
and MNN inference code clip them (its PyTorch predictor does not; the detection task clips to the image in
any case). Exports made with `is_test=True` have this decode in the graph: their boxes are already corners
(x1, y1, x2, y2), and are only clipped (`BOXES_DECODED`; `boxes_form` tells the two apart from the values).

**The scores**: column 1 is the face. ULFD's exports carry the softmax in the graph (its TFLite model's last
layer, `face_scores`; its ONNX files, with or without post-processing, as its MNN and ncnn code reads them),
and TFLite's int8 SOFTMAX always writes scale 1/256 with zero point -128, a range of [0, 1). A model exported
from the training graph (`is_test=False`) gives logits. `scores_form` decides from the tensor's range: an
8-bit tensor whose representable values lie within [0, 1] (one step of slack), or float values within [0, 1]
whose rows sum to 1, are probabilities; anything else is logits, and the face's probability is then the
softmax of the row, sigmoid(l1 - l0).

Faces are then the priors whose face probability is at least min_score, decoded, and greedy NMS
(app/tasks/nms.py, class-agnostic; ULFD's IoU threshold is 0.3) keeps at most max_detections, best first.
Numpy only; nothing here knows a request, an engine or another task module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.errors import ModelDirError
from app.tasks.nms import non_max_suppression

CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2
ULFD_INPUT = (320, 240)  # width, height
ULFD_STRIDES = (8, 16, 32, 64)
ULFD_MIN_SIZES = ((10, 16, 24), (32, 48), (64, 96), (128, 192, 256))
ULFD_IOU = 0.3  # fd_config.iou_threshold
FACE = 1  # the scores' column of the face; column 0 is the background

BOXES_PRIORS, BOXES_DECODED = "priors", "decoded"      # raw locations against the priors, or corners
PROBABILITIES, LOGITS = "probabilities", "logits"      # the scores as a softmax gave them, or before it
CENTERS_MAP, CENTERS_STRIDE = "feature_map", "stride"  # (x + 0.5) / map width, or (x + 0.5) * stride / input
LOCATIONS_XY, LOCATIONS_YX = "xywh", "yxhw"            # a location's four values: PyTorch SSDs', TF SSDs'
ANCHORS_VERSION = 1
PRIORS_MAX = 1 << 20  # far above any face detector's (ULFD 1280x960: 70,720); bounds a hostile anchor file
ANCHOR_FILE_MAX_BYTES = 64 << 20
DECODED_SHARE = 0.9   # boxes_form: the share of rows that must read as corners near their prior


class PriorsError(ModelDirError):
    """An anchor file or a prior set that does not hold together, or a model whose outputs do not fit its priors
    (a model directory fault: 409 at a reload, the version loaded keeps serving)."""


@dataclass(frozen=True)
class Layer:
    """One feature map's priors: its stride (x, y) in input pixels, its size (width, height) when given (else
    ceil(input / stride)), and the prior sizes (width, height) in pixels at each of its cells, in order."""

    stride: tuple[float, float]
    sizes: tuple[tuple[float, float], ...]
    feature_map: tuple[int, int] | None = None


@dataclass(frozen=True)
class AnchorSpec:
    """A prior set as an anchor file describes it (docs/faces.md "Anchor files"): generated from layers, or
    listed (`boxes`, centre form, fractions of the input). `priors()` makes the [N, 4] array."""

    input: tuple[int, int]                   # width, height the priors are for
    layers: tuple[Layer, ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    centers: str = CENTERS_MAP
    clip: bool = True
    center_variance: float = CENTER_VARIANCE
    size_variance: float = SIZE_VARIANCE
    locations: str = LOCATIONS_XY

    def feature_maps(self) -> tuple[tuple[int, int], ...]:
        """Each layer's (width, height) at this input."""
        width, height = self.input
        return tuple(layer.feature_map or (math.ceil(width / layer.stride[0]), math.ceil(height / layer.stride[1]))
                     for layer in self.layers)

    def __len__(self) -> int:
        if not self.layers:
            return len(self.boxes)
        return sum(w * h * len(layer.sizes) for (w, h), layer in zip(self.feature_maps(), self.layers))

    def priors(self) -> Priors:
        """The priors, float32 [N, 4] (cx, cy, w, h) in fractions of the input, in the model's output order."""
        if self.layers:
            boxes = _grid(self)
        else:
            boxes = np.asarray(self.boxes, np.float64).reshape(-1, 4)
        if self.clip:
            boxes = np.clip(boxes, 0.0, 1.0)
        return Priors(boxes.astype(np.float32), self.center_variance, self.size_variance, self.locations)

    def for_input(self, width: int, height: int) -> AnchorSpec:
        """The same priors for another input size: the layers' maps follow from their strides (a layer whose
        map the file fixes, and a listed set of boxes, fit their own input only)."""
        if (width, height) == self.input:
            return self
        if not self.layers or any(layer.feature_map for layer in self.layers):
            raise PriorsError(f"these priors are for a {self.input[0]}x{self.input[1]} input and list their boxes "
                              f"or feature maps; the model's input is {width}x{height}")
        return AnchorSpec((width, height), self.layers, (), self.centers, self.clip, self.center_variance,
                          self.size_variance, self.locations)

    def to_json(self) -> dict:
        """The anchor file's form of this spec (what load_anchors reads back to an equal spec)."""
        document: dict = {"version": ANCHORS_VERSION, "input": list(self.input)}
        if self.layers:
            document["layers"] = [_layer_json(layer) for layer in self.layers]
            document["centers"] = self.centers
        else:
            document["boxes"] = [list(box) for box in self.boxes]
        document.update({"clip": self.clip, "variances": [self.center_variance, self.size_variance],
                         "locations": self.locations})
        return document


ULTRA_LIGHT = AnchorSpec(ULFD_INPUT, tuple(Layer((s, s), tuple((m, m) for m in sizes))
                                           for s, sizes in zip(ULFD_STRIDES, ULFD_MIN_SIZES)))
# RetinaFace (biubug6/Pytorch_Retinaface, cfg_mnet and cfg_re50): strides 8, 16, 32 with min sizes [16, 32],
# [64, 128], [256, 512], centres at (x + 0.5) * stride / input, not clipped; its maps are ceil(input / stride), so
# any input size (640x640: 16800 priors)
RETINAFACE = AnchorSpec((640, 640), tuple(Layer((s, s), tuple((m, m) for m in sizes))
                                          for s, sizes in zip((8, 16, 32), ((16, 32), (64, 128), (256, 512)))),
                        centers=CENTERS_STRIDE, clip=False)
# The prior sets built in, by model.json's detection.anchors (app/model_dir/schema.py BUILT_IN_ANCHORS)
BUILT_IN = {"ultra_light": ULTRA_LIGHT, "retinaface": RETINAFACE}


@dataclass(frozen=True)
class Priors:
    """Prior boxes, float32 [N, 4] (cx, cy, w, h) in fractions of the input, and how locations decode on them."""

    boxes: np.ndarray
    center_variance: float = CENTER_VARIANCE
    size_variance: float = SIZE_VARIANCE
    locations: str = LOCATIONS_XY

    def __len__(self) -> int:
        return len(self.boxes)

    def corners(self) -> np.ndarray:
        """The priors themselves as corners (x1, y1, x2, y2), float32."""
        boxes = self.boxes.astype(np.float64)
        return np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1).astype(np.float32)


@dataclass(frozen=True)
class Faces:
    """Faces found, best first: boxes [K, 4] (ymin, xmin, ymax, xmax, fractions of the model's input, clipped to
    [0, 1], the detection task's rows), scores [K] (the face's probability), landmarks [K, L, 2] ((x, y)
    fractions of the input) or None."""

    boxes: np.ndarray
    scores: np.ndarray
    landmarks: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.scores)


def ultra_light_priors(width: int = ULFD_INPUT[0], height: int = ULFD_INPUT[1]) -> Priors:
    """ULFD's priors for a width x height input (320x240: its 4420)."""
    return ULTRA_LIGHT.for_input(width, height).priors()


def _grid(spec: AnchorSpec) -> np.ndarray:
    width, height = spec.input
    parts = []
    for (map_w, map_h), layer in zip(spec.feature_maps(), spec.layers):
        if spec.centers == CENTERS_MAP:
            xs, ys = (np.arange(map_w) + 0.5) / map_w, (np.arange(map_h) + 0.5) / map_h
        else:
            xs = (np.arange(map_w) + 0.5) * layer.stride[0] / width
            ys = (np.arange(map_h) + 0.5) * layer.stride[1] / height
        sizes = np.asarray(layer.sizes, np.float64) / (width, height)  # [S, 2]
        cy, cx = np.meshgrid(ys, xs, indexing="ij")                       # rows, then columns
        cells = np.stack([cx.ravel(), cy.ravel()], 1)                     # [cells, 2]
        count = len(cells) * len(sizes)
        part = np.empty((count, 4))
        part[:, :2] = np.repeat(cells, len(sizes), axis=0)                # each cell's sizes in turn
        part[:, 2:] = np.tile(sizes, (len(cells), 1))
        parts.append(part)
    return np.concatenate(parts) if parts else np.zeros((0, 4))


# ---- anchor files ----------------------------------------------------------------------------------------------

def load_anchors(path: str | Path) -> AnchorSpec:
    """The anchor file at `path`, checked (PriorsError says what is wrong and where)."""
    return read_anchor_file(path)[0]


def read_anchor_file(path: str | Path) -> tuple[AnchorSpec, bytes]:
    """The anchor file at `path`, checked, and its bytes as read (what an import stores beside the model)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > ANCHOR_FILE_MAX_BYTES:
            raise PriorsError(f"{path}: an anchor file is at most {ANCHOR_FILE_MAX_BYTES >> 20} MiB; this one is "
                              f"{size} bytes")
        data = path.read_bytes()
    except OSError as error:
        raise PriorsError(f"{path}: cannot read the anchor file: {error}") from None
    return anchors_of(data, str(path)), data


def anchors_of(data: bytes, source: str = "the anchor file") -> AnchorSpec:
    """An anchor file's bytes (UTF-8 JSON) as an AnchorSpec, checked."""
    if len(data) > ANCHOR_FILE_MAX_BYTES:
        raise PriorsError(f"{source}: an anchor file is at most {ANCHOR_FILE_MAX_BYTES >> 20} MiB; this one is "
                          f"{len(data)} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise PriorsError(f"{source}: cannot read the anchor file: {error}") from None
    except json.JSONDecodeError as error:
        raise PriorsError(f"{source}: not JSON: {error}") from None
    return parse_anchors(document, source)


def parse_anchors(document: object, source: str = "the anchor file") -> AnchorSpec:
    """An anchor file's JSON (already parsed) as an AnchorSpec, every field checked."""
    if not isinstance(document, Mapping):
        raise PriorsError(f"{source}: an anchor file is a JSON object; got {type(document).__name__}")
    known = {"version", "input", "layers", "boxes", "centers", "clip", "variances", "locations", "comment"}
    unknown = sorted(set(document) - known)
    if unknown:
        raise PriorsError(f"{source}: unknown field(s) {unknown}; an anchor file has {sorted(known)}")
    version = document.get("version", ANCHORS_VERSION)
    if version != ANCHORS_VERSION:
        raise PriorsError(f"{source}: version {version!r}; this service reads anchor files of version "
                          f"{ANCHORS_VERSION}")
    width, height = _pair(document.get("input"), f"{source}: input", int, positive=True)
    has_layers, has_boxes = "layers" in document, "boxes" in document
    if has_layers == has_boxes:
        raise PriorsError(f"{source}: give either `layers` (priors generated per feature map) or `boxes` (the "
                          "priors listed), not both nor neither")
    centers = _choice(document.get("centers", CENTERS_MAP), (CENTERS_MAP, CENTERS_STRIDE), f"{source}: centers")
    clip = document.get("clip", True)
    if not isinstance(clip, bool):
        raise PriorsError(f"{source}: clip is true or false; got {clip!r:.40}")
    variances = _pair(document.get("variances", [CENTER_VARIANCE, SIZE_VARIANCE]), f"{source}: variances", float,
                      positive=True)
    locations = _choice(document.get("locations", LOCATIONS_XY), (LOCATIONS_XY, LOCATIONS_YX), f"{source}: locations")
    layers: tuple[Layer, ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    if has_layers:
        raw = document["layers"]
        if not isinstance(raw, list) or not raw:
            raise PriorsError(f"{source}: layers is a non-empty list of {{stride, min_sizes}} objects")
        layers = tuple(_layer(item, f"{source}: layers[{i}]") for i, item in enumerate(raw))
    else:
        boxes = _boxes(document["boxes"], f"{source}: boxes")
    spec = AnchorSpec((width, height), layers, boxes, centers, clip, variances[0], variances[1], locations)
    if not 0 < len(spec) <= PRIORS_MAX:
        raise PriorsError(f"{source}: these priors number {len(spec)}; a prior set has 1 to {PRIORS_MAX}")
    return spec


def _layer(item: object, where: str) -> Layer:
    if not isinstance(item, Mapping):
        raise PriorsError(f"{where}: a layer is an object with `stride` and `min_sizes`; got {item!r:.60}")
    unknown = sorted(set(item) - {"stride", "min_sizes", "feature_map"})
    if unknown:
        raise PriorsError(f"{where}: unknown field(s) {unknown}; a layer has stride, min_sizes and feature_map")
    if "stride" not in item or "min_sizes" not in item:
        raise PriorsError(f"{where}: a layer needs `stride` (pixels, or [x, y]) and `min_sizes` (pixels)")
    stride = item["stride"]
    stride = _pair(stride if isinstance(stride, list) else [stride, stride], f"{where}: stride", float, positive=True)
    sizes = item["min_sizes"]
    if not isinstance(sizes, list) or not sizes:
        raise PriorsError(f"{where}: min_sizes is a non-empty list of sizes in pixels (a number, or [width, "
                          f"height]); got {sizes!r:.60}")
    pairs = tuple(_pair(s if isinstance(s, list) else [s, s], f"{where}: min_sizes[{i}]", float, positive=True)
                  for i, s in enumerate(sizes))
    feature_map = item.get("feature_map")
    if feature_map is not None:
        feature_map = _pair(feature_map, f"{where}: feature_map", int, positive=True)
    return Layer(stride, pairs, feature_map)


def _layer_json(layer: Layer) -> dict:
    sx, sy = layer.stride
    out: dict = {"stride": sx if sx == sy else [sx, sy],
                 "min_sizes": [w if w == h else [w, h] for w, h in layer.sizes]}
    if layer.feature_map is not None:
        out["feature_map"] = list(layer.feature_map)
    return out


def _boxes(raw: object, where: str) -> tuple[tuple[float, float, float, float], ...]:
    if not isinstance(raw, list) or not raw:
        raise PriorsError(f"{where}: a non-empty list of [cx, cy, w, h] in fractions of the input")
    if len(raw) > PRIORS_MAX:
        raise PriorsError(f"{where}: {len(raw)} boxes; a prior set has at most {PRIORS_MAX}")
    try:
        boxes = np.asarray(raw, np.float64)
    except (TypeError, ValueError):
        boxes = None
    if boxes is None or boxes.ndim != 2 or boxes.shape[1] != 4:
        raise PriorsError(f"{where}: each box is four numbers [cx, cy, w, h]")
    bad = ~np.isfinite(boxes).all(1) | (boxes[:, 2] <= 0) | (boxes[:, 3] <= 0)
    if bad.any():
        i = int(bad.argmax())
        raise PriorsError(f"{where}[{i}]: a box is finite with a positive width and height; got {raw[i]!r:.60}")
    return tuple(tuple(float(v) for v in box) for box in boxes)


def _pair(value: object, where: str, kind: type, positive: bool) -> tuple:
    if not isinstance(value, list) or len(value) != 2:
        raise PriorsError(f"{where}: two numbers; got {value!r:.60}")
    out = []
    for v in value:
        ok = isinstance(v, int) if kind is int else isinstance(v, int | float)
        if isinstance(v, bool) or not ok or (kind is float and not math.isfinite(v)) or (positive and v <= 0):
            what = "positive integers" if kind is int else "positive finite numbers"
            raise PriorsError(f"{where}: two {what}; got {value!r:.60}")
        out.append(kind(v))
    return tuple(out)


def _choice(value: object, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise PriorsError(f"{where}: one of {list(choices)}; got {value!r:.60}")
    return value


# ---- the outputs -------------------------------------------------------------------------------------------

def dequantize(values: np.ndarray, quantization: tuple[float, int] | None = None) -> np.ndarray:
    """A tensor's values as real numbers, float64 of TFLite's float32 DEQUANTIZE (8-bit ones with their
    (scale, zero point)); a float tensor as it is."""
    values = np.asarray(values)
    if quantization is None or values.dtype.kind == "f":
        return values.astype(np.float32).astype(np.float64)
    scale, zero_point = quantization
    real = np.float64(np.float32(scale)) * (values.astype(np.int64) - int(zero_point))
    return real.astype(np.float32).astype(np.float64)


def check_outputs(priors: Priors | int, boxes_shape: Sequence[int], scores_shape: Sequence[int],
                  landmarks_shape: Sequence[int] | None = None) -> None:
    """The model's outputs fit these priors: boxes [1, N, 4], scores [1, N, 2] (landmarks [1, N, 2L]); for the
    registry to call at load. PriorsError otherwise."""
    n = priors if isinstance(priors, int) else len(priors)
    expected = {"boxes": (boxes_shape, 4), "scores": (scores_shape, 2)}
    if landmarks_shape is not None:
        expected["landmarks"] = (landmarks_shape, None)
    for role, (shape, last) in expected.items():
        shape = tuple(int(d) for d in shape)
        rows = shape[1] if len(shape) == 3 and shape[0] == 1 else None
        fits = rows == n and (shape[2] == last if last else shape[2] % 2 == 0 and shape[2] > 0)
        if not fits:
            want = f"[1, {n}, {last}]" if last else f"[1, {n}, 2L]"
            raise PriorsError(f"the model's {role} output is {list(shape)}; its {n} priors need {want}")


def scores_form(values: np.ndarray, quantization: tuple[float, int] | None = None) -> str:
    """PROBABILITIES when the scores [.., N, 2] are a softmax's, LOGITS otherwise (the module docstring says how):
    an 8-bit tensor by its representable range, a float one by its values."""
    values = np.asarray(values)
    if quantization is not None and values.dtype.kind in "iu":
        scale, zero_point = float(quantization[0]), int(quantization[1])
        info = np.iinfo(values.dtype)
        low, high = scale * (info.min - zero_point), scale * (info.max - zero_point)
        return PROBABILITIES if low >= -scale and high <= 1 + scale else LOGITS
    real = dequantize(values, None).reshape(-1, 2)
    if not np.isfinite(real).all():
        return LOGITS
    tolerance = 1e-3
    inside = real.min() >= -tolerance and real.max() <= 1 + tolerance
    return PROBABILITIES if inside and np.abs(real.sum(1) - 1).max() <= tolerance else LOGITS


def face_probabilities(scores: np.ndarray, form: str = PROBABILITIES) -> np.ndarray:
    """Each prior's face probability, float64 [N], from real-valued scores [.., N, 2]: column 1 as it is, or the
    softmax's column 1 of logits (sigmoid(l1 - l0), without overflow)."""
    scores = np.asarray(scores, np.float64).reshape(-1, 2)
    if form == PROBABILITIES:
        return scores[:, FACE].copy()
    if form != LOGITS:
        raise ValueError(f"scores are {PROBABILITIES!r} or {LOGITS!r}, not {form!r}")
    margin = scores[:, FACE] - scores[:, 1 - FACE]
    return np.exp(-np.logaddexp(0.0, -margin))  # sigmoid(l1 - l0), without overflow


def decode_locations(locations: np.ndarray, priors: Priors, rows: np.ndarray | None = None) -> np.ndarray:
    """Raw locations [.., N, 4] (ULFD's order l_cx, l_cy, l_w, l_h; TF's l_cy, l_cx, l_h, l_w with priors'
    `locations` "yxhw") -> corners (x1, y1, x2, y2) in fractions of the input, float64, not clipped. `rows`:
    only these priors' (the candidates), in that order."""
    loc = np.asarray(locations, np.float64).reshape(-1, 4)
    boxes = priors.boxes.astype(np.float64)
    if rows is not None:
        loc, boxes = loc[rows], boxes[rows]
    if priors.locations == LOCATIONS_YX:
        loc = loc[:, [1, 0, 3, 2]]
    centers = loc[:, :2] * priors.center_variance * boxes[:, 2:] + boxes[:, :2]
    sizes = np.exp(loc[:, 2:] * priors.size_variance) * boxes[:, 2:]
    return np.concatenate([centers - sizes / 2, centers + sizes / 2], 1)


def decode_landmarks(landmarks: np.ndarray, priors: Priors, rows: np.ndarray | None = None) -> np.ndarray:
    """Raw landmark offsets [.., N, 2L] (RetinaFace's decode_landm: x = prior cx + l * center variance * prior w,
    y likewise with h) -> points [N, L, 2] (x, y) in fractions of the input, float64."""
    values = np.asarray(landmarks, np.float64)
    values = values.reshape(-1, values.shape[-1])
    boxes = priors.boxes.astype(np.float64)
    if rows is not None:
        values, boxes = values[rows], boxes[rows]
    points = values.reshape(len(values), -1, 2)
    return boxes[:, None, :2] + points * priors.center_variance * boxes[:, None, 2:]


def boxes_form(boxes: np.ndarray, priors: Priors) -> str:
    """BOXES_DECODED when the boxes [.., N, 4] read as corners near their priors (an `is_test=True` export),
    BOXES_PRIORS when they are raw locations: for the import, on the outputs of a run on a synthetic image.
    Decoded corners have x2 > x1 and y2 > y1 and a centre within one prior size of their prior's (a trained
    detector moves a centre by l * 0.1 * size, |l| a few at most), for at least DECODED_SHARE of the rows; raw
    locations scatter around 0 and pass both tests for a small share of the rows only."""
    return BOXES_DECODED if corner_share(boxes, priors) >= DECODED_SHARE else BOXES_PRIORS


def corner_share(boxes: np.ndarray, priors: Priors) -> float:
    """The share of the boxes [.., N, 4] that read as corners near their priors (boxes_form's measure)."""
    values = np.asarray(boxes, np.float64).reshape(-1, 4)
    if len(values) != len(priors):
        raise PriorsError(f"{len(values)} boxes for {len(priors)} priors")
    prior = priors.boxes.astype(np.float64)
    sizes = values[:, 2:] - values[:, :2]
    centers = (values[:, :2] + values[:, 2:]) / 2
    near = (np.abs(centers - prior[:, :2]) <= prior[:, 2:]).all(1)
    corners = (sizes > 0).all(1) & near & np.isfinite(values).all(1)
    return float(corners.mean())


def decode_faces(boxes: np.ndarray, scores: np.ndarray, priors: Priors, *, min_score: float,
                 iou_threshold: float = ULFD_IOU, max_detections: int | None = None, form: str = BOXES_PRIORS,
                 scores_are: str = PROBABILITIES, landmarks: np.ndarray | None = None) -> Faces:
    """A face detector's real-valued outputs (boxes [1, N, 4], scores [1, N, 2], optional landmark offsets
    [1, N, 2L]; dequantize() them first) -> its faces scoring at least min_score, after NMS, best first."""
    n = len(priors)
    box_values = np.asarray(boxes, np.float64).reshape(-1, 4)
    score_values = np.asarray(scores, np.float64)
    if len(box_values) != n or score_values.size != 2 * n:
        raise PriorsError(f"outputs of {len(box_values)} boxes and {score_values.size // 2} scores for {n} priors")
    if form not in (BOXES_PRIORS, BOXES_DECODED):
        raise ValueError(f"boxes are {BOXES_PRIORS!r} or {BOXES_DECODED!r}, not {form!r}")
    probability = face_probabilities(score_values, scores_are)
    rows = np.flatnonzero(probability >= min_score)  # NaN never passes
    if form == BOXES_PRIORS:
        corners = decode_locations(box_values, priors, rows)
    else:
        corners = box_values[rows]
    corners = np.clip(corners, 0.0, 1.0)
    ordered = corners[:, [1, 0, 3, 2]]  # ymin, xmin, ymax, xmax
    kept = non_max_suppression(ordered, probability[rows], iou_threshold, None, max_detections)
    points = None
    if landmarks is not None:
        points = decode_landmarks(landmarks, priors, rows[kept]).astype(np.float32)
    return Faces(ordered[kept].astype(np.float32), probability[rows][kept].astype(np.float32), points)
