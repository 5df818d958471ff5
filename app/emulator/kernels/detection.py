"""TFLite_Detection_PostProcess: SSD box decoding and non-maximum suppression, byte for byte as TFLite's kernel.

The custom operator that ends SSD and EfficientDet-Lite detectors (tensorflow/lite/kernels/
detection_postprocess.cc, as built into ai-edge-litert 2.3.0: clang, libstdc++, x86-64). Its outputs
are float32 and are reproduced exactly; every point below was read in the source and the binary,
then measured against the runtime (tests/test_emulator_detection.py):

- Box decoding in double: ycenter = y / y_scale * anchor_h + anchor_y, half_h = 0.5 * exp(h / h_scale) *
  anchor_h, each rounded to float once; corners in float. `exp` is the C library's double exp
  (libm.exp), not numpy's. uint8 box encodings and anchors are dequantized in float:
  (float(q) - zero_point) * scale. With uint8 box encodings, the anchors tensor is read as uint8
  bytes with its own scale and zero point, whatever its type (a float32 tensor has scale 0).
- uint8 class predictions go through the runtime's optimized Dequantize: on x86 its NEON path
  (emulated on SSE) takes the first 8 * (size // 8) values as float(q) * scale + float(-zero_point *
  scale) in float, the rest as float(scale * (q - zero_point)) in double: the two differ in the
  last bit for about 45% of the bytes, so a position takes the table of its path.
- Scores are kept when >= nms_score_threshold; a box is suppressed when its IoU (float, in the kernel's
  order of operations) with a kept box is > nms_iou_threshold, so IoU exactly at the threshold keeps it.
- Ties: per class, boxes are ordered by a stable sort (equal scores: lower anchor first). Fast NMS's
  best class per anchor is ArgMaxVector (lowest class index among equals; NaN-aware lanes of 4);
  with max_classes_per_detection > 1 it is libstdc++'s std::partial_sort, a heap that is not
  stable, reproduced step by step. Regular NMS merges classes with std::inplace_merge (stable):
  equal scores keep class order, then anchor order.
- Rows the kernel does not write: regular NMS fills rows count..max_detections with zeros and leaves
  the rows past max_detections (there are max_detections * max_classes_per_detection rows) untouched;
  fast NMS writes only the detections' rows, and within each anchor's group only min(max_classes,
  num_classes) rows. The runtime leaves whatever its memory held there (earlier invokes' boxes,
  other tensors' bytes); the emulator writes zeros.
- Regular NMS is the single-thread kernel. With num_threads > 1 the runtime splits the classes across
  threads, and that path is broken: it never runs class num_threads (a worker's next class is
  ++next_col, from num_threads), writes past a buffer when detections_per_class < max_detections,
  and merges equal scores in thread order.

Inputs the kernel refuses (int8 tensors, float box encodings with quantized anchors, a background
offset other than 0 or 1, IoU threshold outside (0, 1], ...) fail at load here, where TFLite fails at
invoke. A decoded box with ymin > ymax or xmin > xmax fails at invoke, as in TFLite.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP, PostProcessOptions, read_options
from app.emulator import libm
from app.emulator.errors import InvokeFailed, Unsupported
from app.emulator.kernels.common import OpView, Step
from app.emulator.kernels.reduce import arg_min_max_vector
from app.tflite_file import Tensor, TfliteFileError

f32 = np.float32
f64 = np.float64
NUM_COORD_BOX = 4
INT32_MAX = 2**31 - 1


# ---- box decoding ----

def dequantize_box_encodings(q: np.ndarray, quant_zero_point: int, quant_scale: float) -> np.ndarray:
    """DequantizeBoxEncodings' Dequantizer: (float(x) - zero_point) * scale, all in float."""
    return (q.astype(f32) - f32(quant_zero_point)) * f32(quant_scale)


def decode_center_size_boxes(box_centersize: np.ndarray, anchor: np.ndarray, scale_values,
                             exp_memo: dict | None = None) -> np.ndarray:
    """DecodeCenterSizeBoxes: [N, 4] (y, x, h, w) encodings and anchors -> [N, 4] (ymin, xmin, ymax, xmax).

    Centers and half sizes in double (no fused multiply-add in the runtime's build), each rounded to
    float once; the corners are float sums. exp_memo: libm.exp's memo, kept by the caller."""
    encoding = box_centersize[:, :NUM_COORD_BOX].astype(f64)
    anchor = anchor.astype(f64)
    scale = np.array([f64(s) for s in scale_values])
    with np.errstate(all="ignore"):  # inf and NaN propagate as in C
        center = (encoding[:, :2] / scale[:2] * anchor[:, 2:] + anchor[:, :2]).astype(f32)      # ycenter, xcenter
        half = (0.5 * libm.exp(encoding[:, 2:] / scale[2:], exp_memo) * anchor[:, 2:]).astype(f32)  # half_h, half_w
        return np.concatenate([center - half, center + half], axis=1)


def validate_boxes(decoded_boxes: np.ndarray) -> bool:
    """ValidateBoxes: no box with ymin > ymax or xmin > xmax (NaN compares false: valid)."""
    return not bool(np.any((decoded_boxes[:, 0] > decoded_boxes[:, 2]) | (decoded_boxes[:, 1] > decoded_boxes[:, 3])))


# ---- class predictions ----

def dequantize_class_predictions_tables(quant_scale: float, quant_zero_point: int) -> tuple[np.ndarray, np.ndarray]:
    """optimized_ops::Dequantize (uint8) on all 256 bytes: (the 8-wide NEON-on-SSE path, the scalar tail).

    NEON path: float(q) * float(scale) + float(-zero_point * scale), a float multiply then a float add.
    Tail: float(scale * (q - zero_point)) in double."""
    q = np.arange(256)
    scale = f64(f32(quant_scale))  # op_params.scale: the tensor's float scale, held as a double
    zero_point = int(quant_zero_point)
    zero_times_scale = f32(f64(-zero_point) * scale)
    vector = q.astype(f32) * f32(scale) + zero_times_scale
    scalar = (scale * (q - zero_point).astype(f64)).astype(f32)
    return vector.astype(f32), scalar


class ClassScores:
    """The scores NMS reads: [N, num_classes] float32 (background column left out) as the kernel's `scores` holds
    them. Float predictions are used as they are."""

    def __init__(self, values: np.ndarray, label_offset: int):
        self.values = values[:, label_offset:]

    def all(self) -> np.ndarray:
        return self.values

    def rows(self, anchors: np.ndarray) -> np.ndarray:
        return self.values[anchors]

    def best(self) -> np.ndarray | None:
        """Each anchor's highest score, or None when a NaN leaves no strict order (the sort then decides)."""
        return None if np.isnan(self.values).any() else self.values.max(axis=1)


class QuantizedClassScores(ClassScores):
    """uint8 class predictions through DequantizeClassPredictions: the whole [N, C] tensor as one flat vector, the
    first 8 * (size // 8) values by the vector table, the rest by the scalar one.

    Values are dequantized where they are read: all() for regular NMS; for fast NMS each anchor's best
    score (the best byte through a table that never decreases: the same value) and the selected rows."""

    def __init__(self, q: np.ndarray, tables: tuple[np.ndarray, np.ndarray], label_offset: int):
        self.q, self.tables, self.label_offset = q, tables, label_offset
        self.split = q.size - q.size % 8  # flat positions from here on take the scalar table
        self.monotone = all(bool(np.all(np.diff(t) >= 0)) for t in tables)  # a positive scale

    def _dequantize(self, anchors: np.ndarray) -> np.ndarray:
        q = self.q[anchors]
        values = self.tables[0].take(q)
        flat = anchors[:, None] * self.q.shape[1] + np.arange(self.q.shape[1])
        tail = flat >= self.split
        if tail.any():
            values[tail] = self.tables[1].take(q[tail])
        return values[:, self.label_offset:]

    def all(self) -> np.ndarray:
        return self._dequantize(np.arange(self.q.shape[0]))

    def rows(self, anchors: np.ndarray) -> np.ndarray:
        return self._dequantize(np.asarray(anchors))

    def best(self) -> np.ndarray:
        if not self.monotone:
            return self.all().max(axis=1)
        best = self.tables[0].take(self.q[:, self.label_offset:].max(axis=1))
        last = np.arange(self.split // self.q.shape[1], self.q.shape[0])  # rows that reach the tail
        best[last] = self._dequantize(last).max(axis=1)
        return best


# ---- sorting, as the kernel's C++ library sorts ----

def arg_max_vector(values: np.ndarray) -> np.ndarray:
    """optimized_ops::ArgMaxVector<float> per row of [R, size]: the lowest index of the maximum, NaN ignored
    as the kernel's NEON-on-SSE code ignores it (reduce.arg_min_max_vector, which ARG_MAX runs too)."""
    return arg_min_max_vector(values, is_arg_max=True)


class _Heap:
    """libstdc++'s heap algorithms on many rows at once, with comp(a, b) = values[a] > values[b].

    Each row is its own array of indices (first[r, :]) with the values they point to alongside;
    every step applies to a subset of rows (`rows`), so rows take their own data-dependent paths."""

    def __init__(self, indices: np.ndarray, values: np.ndarray):
        self.index, self.value = indices, values  # [R, n] each, moved together

    def _move(self, rows, to, source):
        self.index[rows, to] = self.index[rows, source]
        self.value[rows, to] = self.value[rows, source]

    def push_heap(self, rows, hole, top, value_index, value):
        """std::__push_heap: sift `value` up from `hole` while comp(parent, value)."""
        hole = hole.copy()
        active = np.ones(rows.size, bool)
        while True:
            parent = (hole - 1) // 2  # hole > top >= 0 wherever it is used, so // is C's division
            active &= hole > top
            if active.any():
                rising = np.flatnonzero(active)
                active[rising] = self.value[rows[rising], parent[rising]] > value[rising]
            if not active.any():
                break
            moving = np.flatnonzero(active)
            self._move(rows[moving], hole[moving], parent[moving])
            hole[moving] = parent[moving]
        self.index[rows, hole] = value_index
        self.value[rows, hole] = value

    def adjust_heap(self, rows, hole, length: int, value_index, value):
        """std::__adjust_heap: move the hole down to a leaf along the larger child (comp), then push `value`."""
        top = hole.copy()
        hole = hole.copy()
        second = hole.copy()
        while True:
            moving = np.flatnonzero(second < (length - 1) // 2)
            if moving.size == 0:
                break
            second[moving] = 2 * (second[moving] + 1)
            r = rows[moving]
            left = self.value[r, second[moving]] > self.value[r, second[moving] - 1]
            second[moving] -= left
            self._move(r, hole[moving], second[moving])
            hole[moving] = second[moving]
        if length % 2 == 0:
            last = np.flatnonzero(second == (length - 2) // 2)
            if last.size:
                second[last] = 2 * (second[last] + 1)
                self._move(rows[last], hole[last], second[last] - 1)
                hole[last] = second[last] - 1
        self.push_heap(rows, hole, top, value_index, value)

    def make_heap(self, length: int):
        rows = np.arange(self.index.shape[0])
        if length < 2:
            return
        for parent in range((length - 2) // 2, -1, -1):
            hole = np.full(rows.size, parent)
            self.adjust_heap(rows, hole, length, self.index[:, parent].copy(), self.value[:, parent].copy())

    def pop_heap(self, rows, length: int, result: int):
        """std::__pop_heap(first, first + length, result): *result = *first, then re-heap with old *result."""
        value_index, value = self.index[rows, result].copy(), self.value[rows, result].copy()
        self._move(rows, np.full(rows.size, result), np.zeros(rows.size, np.int64))
        self.adjust_heap(rows, np.zeros(rows.size, np.int64), length, value_index, value)


def decreasing_partial_arg_sort(values: np.ndarray, num_to_sort: int) -> np.ndarray:
    """DecreasingPartialArgSort per row of [R, num_values]: the first num_to_sort indices, best first.

    num_to_sort == 1: ArgMaxVector. Otherwise std::partial_sort(indices, +num_to_sort, +num_values)
    with comp(i, j) = values[i] > values[j], as libstdc++ implements it (__heap_select: make_heap on
    the first num_to_sort, then each later index that beats the heap's top replaces it; __sort_heap).
    Equal scores come out in the order that algorithm leaves them, which no stable rule describes."""
    rows, num_values = values.shape
    if num_to_sort == 1:
        return arg_max_vector(values)[:, None]
    order = np.broadcast_to(np.arange(num_values), (rows, num_values)).copy()
    heap = _Heap(order, values.copy())
    middle = num_to_sort
    heap.make_heap(middle)
    for i in range(middle, num_values):
        rows_in = np.flatnonzero(heap.value[:, i] > heap.value[:, 0])  # comp(i, first)
        if rows_in.size:
            heap.pop_heap(rows_in, middle, i)
    all_rows = np.arange(rows)
    for last in range(middle - 1, 0, -1):  # __sort_heap
        heap.pop_heap(all_rows, last, last)
    return heap.index[:, :num_to_sort]


# ---- non-maximum suppression ----

def box_areas(decoded_boxes: np.ndarray) -> np.ndarray:
    """(ymax - ymin) * (xmax - xmin) in float, as ComputeIntersectionOverUnion computes each area."""
    with np.errstate(all="ignore"):
        return (decoded_boxes[:, 2] - decoded_boxes[:, 0]) * (decoded_boxes[:, 3] - decoded_boxes[:, 1])


def compute_intersection_over_union(boxes_i: np.ndarray, areas_i: np.ndarray, boxes_j: np.ndarray,
                                    areas_j: np.ndarray) -> np.ndarray:
    """ComputeIntersectionOverUnion(box i, box j) for every i (rows) and j (columns), in float; 0 where an
    area is <= 0.

    std::max<float>(a, b) is (a < b) ? b : a and std::min<float>(a, b) is (b < a) ? b : a, kept as
    written (with box i as a) so NaN and signed zeros go where the C++ sends them."""
    yi0, xi0, yi1, xi1 = (boxes_i[:, k, None] for k in range(NUM_COORD_BOX))
    yj0, xj0, yj1, xj1 = (boxes_j[None, :, k] for k in range(NUM_COORD_BOX))
    area_i, area_j = areas_i[:, None], areas_j[None, :]
    with np.errstate(all="ignore"):
        height = np.where(yj1 < yi1, yj1, yi1) - np.where(yi0 < yj0, yj0, yi0)
        width = np.where(xj1 < xi1, xj1, xi1) - np.where(xi0 < xj0, xj0, xi0)
        intersection = np.where(height < 0, f32(0), height) * np.where(width < 0, f32(0), width)
        iou = intersection / (area_i + area_j - intersection)
    return np.where((area_i <= 0) | (area_j <= 0), f32(0), iou)


class SingleClassSuppression:
    """NonMaxSuppressionSingleClassHelper on one score per anchor, run as far as asked: take(n) gives the next n
    anchors it selects (fewer when it runs out), in its order.

    The kernel keeps scores >= the threshold, sorts them stably (decreasing; equal scores by anchor),
    and walks them: each still active candidate is selected and deactivates every later one whose
    IoU with it is > the IoU threshold. A candidate is therefore selected exactly when no box
    selected before it overlaps it above the threshold. That is decided here a block of candidates
    at a time: the block against the boxes already selected, then its survivors among themselves, in
    order; candidates after the last selection asked for are never compared."""

    def __init__(self, decoded_boxes: np.ndarray, areas: np.ndarray, scores: np.ndarray,
                 score_threshold: np.float32, iou_threshold: np.float32):
        keep_indices = np.flatnonzero(scores >= score_threshold)
        self.candidates = keep_indices[np.argsort(-scores[keep_indices], kind="stable")]
        self.boxes, self.areas = decoded_boxes[self.candidates], areas[self.candidates]
        self.iou_threshold = iou_threshold
        self.position = 0  # candidates before it are decided
        self.selected: list[int] = []  # positions in self.candidates
        self.block_size = 32  # doubled while whole blocks are suppressed

    def _overlapping(self, chosen: np.ndarray, block: np.ndarray) -> np.ndarray:
        """For each candidate of the block: does a chosen box (earlier in the order) overlap it above the threshold?"""
        iou = compute_intersection_over_union(self.boxes[chosen], self.areas[chosen], self.boxes[block],
                                              self.areas[block])
        return (iou > self.iou_threshold).any(axis=0)

    def take(self, count: int) -> np.ndarray:
        wanted = len(self.selected) + count
        while len(self.selected) < wanted and self.position < self.candidates.size:
            needed = wanted - len(self.selected)
            end = min(self.position + max(self.block_size, 2 * needed), self.candidates.size)
            block = np.arange(self.position, end)
            self.position = end
            if self.selected:
                block = block[~self._overlapping(np.array(self.selected), block)]
            if block.size == 0:
                self.block_size *= 2
                continue
            if needed == 1:  # the first survivor, whatever follows it
                self.selected.append(int(block[0]))
                self.position = int(block[0]) + 1
                break
            among = compute_intersection_over_union(self.boxes[block], self.areas[block], self.boxes[block],
                                                    self.areas[block]) > self.iou_threshold
            suppressed = np.zeros(block.size, bool)
            for k in range(block.size):
                if suppressed[k]:
                    continue
                self.selected.append(int(block[k]))
                if len(self.selected) == wanted:
                    self.position = int(block[k]) + 1  # the rest of the block is decided next time
                    break
                suppressed |= among[k]
        return self.candidates[self.selected[wanted - count:wanted]]


def non_max_suppression_single_class(decoded_boxes: np.ndarray, areas: np.ndarray, scores: np.ndarray,
                                     max_detections: int, score_threshold: np.float32,
                                     iou_threshold: np.float32) -> np.ndarray:
    """NonMaxSuppressionSingleClassHelper: the (at most max_detections) anchors it selects, best first."""
    suppression = SingleClassSuppression(decoded_boxes, areas, scores, score_threshold, iou_threshold)
    return suppression.take(max_detections)


@dataclass(frozen=True)
class Detections:
    """The four outputs, in the operator's order."""

    boxes: np.ndarray    # [1, rows, 4] float32
    classes: np.ndarray  # [1, rows]
    scores: np.ndarray   # [1, rows]
    count: np.ndarray    # [1]

    def astuple(self) -> tuple[np.ndarray, ...]:
        return self.boxes, self.classes, self.scores, self.count


def _empty_outputs(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unwritten rows: zeros here (the runtime leaves its memory's old contents)."""
    return np.zeros((1, rows, NUM_COORD_BOX), f32), np.zeros((1, rows), f32), np.zeros((1, rows), f32)


def non_max_suppression_multi_class_fast(options: PostProcessOptions, decoded_boxes: np.ndarray,
                                         class_scores: ClassScores) -> Detections:
    """NonMaxSuppressionMultiClassFastHelper: NMS once, on each anchor's best class score; each selected anchor
    then reports its min(max_classes_per_detection, num_classes) best classes."""
    max_categories_per_anchor = options.max_classes_per_detection
    num_categories_per_anchor = min(max_categories_per_anchor, options.num_classes)
    areas = box_areas(decoded_boxes)
    max_scores, class_indices = class_scores.best(), None
    if max_scores is None:  # NaN: the sort's own first index decides which value is each anchor's best
        box_scores = class_scores.all()
        class_indices = decreasing_partial_arg_sort(box_scores, num_categories_per_anchor)
        max_scores = np.take_along_axis(box_scores, class_indices[:, :1], axis=1)[:, 0]
    selected = non_max_suppression_single_class(
        decoded_boxes, areas, max_scores, options.max_detections,
        options.non_max_suppression_score_threshold, options.intersection_over_union_threshold)
    selected_scores = class_scores.rows(selected)
    if class_indices is None:  # a strict order: every anchor's best is its maximum; sort the selected rows only
        class_indices = decreasing_partial_arg_sort(selected_scores, num_categories_per_anchor)
    else:
        class_indices = class_indices[selected]
    boxes, classes, scores = _empty_outputs(options.num_detected_boxes)
    rows = max_categories_per_anchor * np.arange(selected.size)[:, None] + np.arange(num_categories_per_anchor)
    boxes[0, rows] = decoded_boxes[selected][:, None, :]
    classes[0, rows] = class_indices
    scores[0, rows] = np.take_along_axis(selected_scores, class_indices, axis=1)
    return Detections(boxes, classes, scores, np.array([selected.size], f32))


def non_max_suppression_multi_class_regular(options: PostProcessOptions, decoded_boxes: np.ndarray,
                                            class_scores: ClassScores) -> Detections:
    """NonMaxSuppressionMultiClassRegularHelper (one thread): NMS per class, up to min(detections_per_class,
    max_detections) each; the classes' lists merged by std::inplace_merge (stable) in class order, the best
    max_detections kept.

    So the kept rows are the best max_detections of all classes' selections, equal scores in class
    order, then in each class's own order. They are drawn here best first from a queue holding each
    class's next selection (a class's first is its best kept score, lowest anchor first), and a class's
    NMS is only run as far as its selections are drawn."""
    box_scores = class_scores.all()
    max_detections = options.max_detections
    num_detections_per_class = min(options.detections_per_class, max_detections)
    threshold = options.non_max_suppression_score_threshold
    areas = box_areas(decoded_boxes)
    with np.errstate(invalid="ignore"):
        kept = box_scores >= threshold
    suppressions: dict[int, SingleClassSuppression] = {}

    def suppression(col: int) -> SingleClassSuppression:
        if col not in suppressions:
            suppressions[col] = SingleClassSuppression(decoded_boxes, areas, box_scores[:, col], threshold,
                                                       options.intersection_over_union_threshold)
        return suppressions[col]

    first = np.argmax(np.where(kept, box_scores, -np.inf), axis=0)  # lowest anchor among a class's best
    queue = []
    for col, anchor in enumerate(first.tolist()):
        if not kept[anchor, col]:
            if not kept[:, col].any():
                continue
            anchor = int(suppression(col).take(1)[0])  # its kept scores are all -inf: leave it to the sort
        queue.append((-float(box_scores[anchor, col]), col, 0, anchor))
    heapq.heapify(queue)
    kept_rows: list[tuple[int, int, float]] = []  # (anchor, class, score)
    while queue and len(kept_rows) < max_detections:
        _, col, rank, anchor = heapq.heappop(queue)
        kept_rows.append((anchor, col, box_scores[anchor, col]))
        if rank + 1 == num_detections_per_class:
            continue
        if col not in suppressions:
            suppression(col).take(1)  # its first selection, the one just drawn
        following = suppressions[col].take(1)
        if following.size:
            heapq.heappush(queue, (-float(box_scores[following[0], col]), col, rank + 1, int(following[0])))
    boxes, classes, scores = _empty_outputs(options.num_detected_boxes)
    count = len(kept_rows)
    if count:
        anchors, cols, values = zip(*kept_rows)
        boxes[0, :count] = decoded_boxes[list(anchors)]
        classes[0, :count] = cols
        scores[0, :count] = values
    return Detections(boxes, classes, scores, np.array([count], f32))


# ---- prepare ----

def _quantization(tensor: Tensor) -> tuple[float, int]:
    """params.scale and params.zero_point: (0, 0) for a tensor without quantization."""
    if tensor.quantization is None:
        return 0.0, 0
    return float(f32(tensor.quantization.scale[0])), int(tensor.quantization.zero_point[0])


def _read_options(view: OpView) -> PostProcessOptions:
    """The options as the kernel's Init reads them (app/detection_postprocess.py), refused where its Prepare or
    Eval would fail."""
    try:
        options = read_options(view.operator)
    except TfliteFileError as e:  # not a flexbuffer map, or a value that is no number
        raise Unsupported(str(e)) from None
    if options.num_classes <= 0:
        raise Unsupported(f"num_classes is {options.num_classes}; the kernel needs at least 1")
    if options.max_detections < 0:
        raise Unsupported(f"max_detections is {options.max_detections}; expected >= 0")
    if options.max_classes_per_detection <= 0:  # fast NMS refuses it; regular NMS would write past its outputs
        raise Unsupported(f"max_classes_per_detection is {options.max_classes_per_detection}; expected >= 1")
    if options.use_regular_non_max_suppression and min(options.detections_per_class, options.max_detections) <= 0:
        raise Unsupported("regular NMS needs detections_per_class and max_detections >= 1 (the kernel fails)")
    iou = options.intersection_over_union_threshold
    if not (iou > 0 and iou <= 1):
        raise Unsupported(f"nms_iou_threshold is {iou}; the kernel needs 0 < threshold <= 1")
    if options.num_detected_boxes > INT32_MAX:
        raise Unsupported("max_detections * max_classes_per_detection overflows int32")
    return options


def prepare_detection_postprocess(view: OpView) -> Step:
    if len(view.operator.inputs) != 3 or len(view.operator.outputs) != 4:
        raise Unsupported(f"expected 3 inputs and 4 outputs, got {len(view.operator.inputs)} and "
                          f"{len(view.operator.outputs)}")
    options = _read_options(view)
    encodings, predictions, anchors = view.input(0), view.input(1), view.input(2)
    if len(encodings.shape) != 3 or encodings.shape[0] != 1 or encodings.shape[2] < NUM_COORD_BOX:
        raise Unsupported(f"box encodings are {list(encodings.shape)}; expected [1, boxes, >= 4]")
    num_boxes = encodings.shape[1]
    if len(predictions.shape) != 3 or predictions.shape[:2] != (1, num_boxes):
        raise Unsupported(f"class predictions are {list(predictions.shape)}; expected [1, {num_boxes}, classes]")
    if anchors.shape != (num_boxes, NUM_COORD_BOX):
        raise Unsupported(f"anchors are {list(anchors.shape)}; expected [{num_boxes}, 4]")
    num_classes_with_background = predictions.shape[2]
    if num_classes_with_background - options.num_classes not in (0, 1):
        raise Unsupported(f"class predictions have {num_classes_with_background} columns for num_classes "
                          f"{options.num_classes}; expected num_classes, or one more for the background")
    for name, tensor in (("box encodings", encodings), ("class predictions", predictions)):
        if tensor.type not in ("UINT8", "FLOAT32"):
            raise Unsupported(f"{name} are {tensor.type}; the kernel takes UINT8 or FLOAT32 (it fails on others)")
    if encodings.type == "FLOAT32" and anchors.type != "FLOAT32":
        raise Unsupported(f"anchors are {anchors.type} with float box encodings; the kernel needs FLOAT32 anchors")
    if encodings.type == "UINT8" and anchors.type not in ("UINT8", "INT8", "FLOAT32"):
        raise Unsupported(f"anchors are {anchors.type}; expected UINT8 or FLOAT32")
    rows = options.num_detected_boxes
    output_shapes = {0: (1, rows, NUM_COORD_BOX), 1: (1, rows), 2: (1, rows), 3: (1,)}  # whatever the file says
    for position in output_shapes:
        if view.output(position).type != "FLOAT32":
            raise Unsupported(f"output {position} {view.output(position).name!r} is {view.output(position).type}; "
                              "the kernel writes FLOAT32")

    scale_values = options.scale_values
    if encodings.type == "UINT8":
        box_scale, box_zero_point = _quantization(encodings)
        anchor_scale, anchor_zero_point = _quantization(anchors)

        def anchors_of(values: np.ndarray) -> np.ndarray:  # the anchor tensor's bytes, as uint8, with its params
            raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1)[:num_boxes * NUM_COORD_BOX]
            return dequantize_box_encodings(raw.reshape(num_boxes, NUM_COORD_BOX), anchor_zero_point, anchor_scale)

        def box_centersize_of(values: np.ndarray) -> np.ndarray:
            return dequantize_box_encodings(values[0, :, :NUM_COORD_BOX], box_zero_point, box_scale)
    else:
        def anchors_of(values: np.ndarray) -> np.ndarray:
            return values

        def box_centersize_of(values: np.ndarray) -> np.ndarray:
            return values[0, :, :NUM_COORD_BOX]

    label_offset = num_classes_with_background - options.num_classes
    if predictions.type == "UINT8":
        tables = dequantize_class_predictions_tables(*_quantization(predictions))

        def scores_of(values: np.ndarray) -> ClassScores:
            return QuantizedClassScores(values[0], tables, label_offset)
    else:
        def scores_of(values: np.ndarray) -> ClassScores:
            return ClassScores(values[0], label_offset)

    suppress = (non_max_suppression_multi_class_regular if options.use_regular_non_max_suppression
                else non_max_suppression_multi_class_fast)
    constant_anchors = None if anchors.data is None else anchors_of(anchors.data)
    exp_memo: dict = {}  # a step runs one invoke at a time (an Interpreter is not thread-safe)

    def run(box_encodings: np.ndarray, class_predictions: np.ndarray, anchor_values: np.ndarray | None = None):
        anchor = constant_anchors if anchor_values is None else anchors_of(anchor_values)
        decoded_boxes = decode_center_size_boxes(box_centersize_of(box_encodings), anchor, scale_values, exp_memo)
        if not validate_boxes(decoded_boxes):
            raise InvokeFailed(f"#{view.operator.index} {POSTPROCESS_OP}: a decoded box has ymin > ymax or xmin > xmax "
                               "(negative anchor sizes?); TFLite's kernel fails on it too")
        return suppress(options, decoded_boxes, scores_of(class_predictions)).astuple()

    positions = (0, 1) if constant_anchors is not None else (0, 1, 2)
    return view.step(run, *positions, resized=output_shapes,
                     nms="regular" if options.use_regular_non_max_suppression else "fast")


PREPARE = {POSTPROCESS_OP: prepare_detection_postprocess}
