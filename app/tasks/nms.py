"""Greedy non-maximum suppression, vectorised, class-aware or class-agnostic: the YOLO decoders' last step.

Candidates go best first (a higher score first; between equal scores, the lower index first), and each one
kept suppresses every later candidate whose IoU with it is above the threshold (strictly, as TFLite's
detection_postprocess.cc and torchvision's nms do); class-aware, only candidates of its own class. The
IoU is TFLite's (ComputeIntersectionOverUnion): 0 when either box has no area, else intersection / union.
Numpy only: one vectorised IoU row per kept box, so the cost is (boxes kept) x (candidates), and the loop
stops at `max_output` kept boxes.
"""

from __future__ import annotations

import numpy as np


def best_first(scores: np.ndarray) -> np.ndarray:
    """Indices of `scores` from the highest to the lowest, equal scores in index order."""
    return np.argsort(-np.asarray(scores, np.float64), kind="stable")


def iou_with(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box with each of `boxes`, all as corners (y1, x1, y2, x2) in float64 (the axes' order does
    not matter, only that both boxes use the same); 0 where either box has no area."""
    columns = Columns(np.asarray(boxes, np.float64))
    one = Columns(np.asarray(box, np.float64)[None])
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = columns.overlap(one, 0, slice(None))
    return np.where((one.area[0] > 0) & (columns.area > 0), iou, 0.0)


class Columns:
    """Boxes as four contiguous corner columns and their areas, for one IoU row at a time."""

    def __init__(self, boxes: np.ndarray):
        self.y1, self.x1, self.y2, self.x2 = (np.ascontiguousarray(boxes[:, i]) for i in range(4))
        self.area = (self.y2 - self.y1) * (self.x2 - self.x1)

    def overlap(self, other: Columns, i: int, rows: slice) -> np.ndarray:
        """intersection / union of `other`'s box i with this one's boxes `rows`. Where either box has no area
        the intersection is 0, so the value is 0, -0 or NaN: never above a positive threshold (iou_with makes
        it 0)."""
        height = np.minimum(self.y2[rows], other.y2[i])
        height -= np.maximum(self.y1[rows], other.y1[i])
        width = np.minimum(self.x2[rows], other.x2[i])
        width -= np.maximum(self.x1[rows], other.x1[i])
        np.maximum(height, 0.0, out=height)
        np.maximum(width, 0.0, out=width)
        intersection = height * width
        union = self.area[rows] + other.area[i]
        union -= intersection
        intersection /= union
        return intersection


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float,
                        classes: np.ndarray | None = None, max_output: int | None = None) -> np.ndarray:
    """The indices of the boxes kept, best first: boxes [K, 4] as corners, scores [K]; with `classes` [K] a box
    suppresses only boxes of its own class (class-aware), without them any box (class-agnostic). The threshold
    is positive (model.json's nms_iou is), so boxes without area suppress nothing and are suppressed by nothing."""
    count = len(scores)
    limit = count if max_output is None else min(max_output, count)
    if count == 0 or limit <= 0:
        return np.zeros(0, np.int64)
    order = best_first(scores)
    ordered = Columns(np.asarray(boxes, np.float64)[order])
    ordered_classes = None if classes is None else np.asarray(classes)[order]
    alive = np.ones(count, bool)
    kept = []
    position = 0
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            kept.append(position)
            if len(kept) == limit or position + 1 == count:
                break
            later = slice(position + 1, count)
            overlapping = ordered.overlap(ordered, position, later) > iou_threshold
            if ordered_classes is not None:
                overlapping &= ordered_classes[later] == ordered_classes[position]
            rest = alive[later]  # a view: suppression lands in `alive`
            rest &= ~overlapping
            following = int(rest.argmax())  # the first one still alive, if any
            if not rest[following]:
                break
            position += 1 + following
    return order[np.asarray(kept, np.int64)]
