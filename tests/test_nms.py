"""app/tasks/nms.py: greedy NMS, vectorised, against the loop that defines it, and TFLite's IoU."""

from __future__ import annotations

import numpy as np
import pytest

from app.tasks.nms import best_first, iou_with, non_max_suppression


def iou(a, b) -> float:
    """TFLite's ComputeIntersectionOverUnion (detection_postprocess.cc)."""
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0.0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0.0)
    return inter / (area_a + area_b - inter)


def greedy(boxes, scores, threshold, classes=None, limit=None):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    kept = []
    for i in order:
        if limit is not None and len(kept) == limit:
            break
        if all(iou(boxes[k], boxes[i]) <= threshold or (classes is not None and classes[k] != classes[i])
               for k in kept):
            kept.append(i)
    return kept


def random_boxes(rng, count, degenerate=False):
    corners = np.sort(rng.uniform(0, 1, (count, 2, 2)), axis=1).reshape(count, 4)[:, [0, 2, 1, 3]]
    if degenerate:  # some without area: a zero side, or inverted
        corners[::7, 2] = corners[::7, 0]
        corners[3::11, [1, 3]] = corners[3::11, [3, 1]]
    return corners


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("aware", [False, True])
def test_nms_is_the_greedy_loop(seed, aware):
    rng = np.random.default_rng(seed)
    boxes = random_boxes(rng, 300, degenerate=seed % 2 == 1)
    scores = np.round(rng.uniform(0, 1, 300), 2)  # many equal scores
    classes = rng.integers(0, 4, 300) if aware else None
    for threshold, limit in ((0.3, None), (0.5, 25), (0.9, 1000)):
        kept = non_max_suppression(boxes, scores, threshold, classes, limit)
        assert kept.tolist() == greedy(boxes.tolist(), scores.tolist(), threshold,
                                       None if classes is None else classes.tolist(), limit)


def test_iou_is_tflites():
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, 50, degenerate=True)
    for box in boxes[:10]:
        np.testing.assert_array_equal(iou_with(box, boxes), [iou(box.tolist(), b) for b in boxes.tolist()])
    assert iou_with(np.array([0, 0, 1, 1.0]), np.array([[0, 0, 1, 1.0], [0, 0.5, 1, 1.5], [2, 2, 3, 3]])).tolist() \
        == [1.0, 1 / 3, 0.0]


def test_edges():
    assert non_max_suppression(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []
    assert non_max_suppression(np.ones((3, 4)), np.ones(3), 0.5, max_output=0).tolist() == []
    same = np.tile([0.0, 0.0, 1.0, 1.0], (3, 1))
    assert non_max_suppression(same, np.array([0.5, 0.7, 0.7]), 0.5).tolist() == [1]  # tie: the first
    assert non_max_suppression(same, np.array([0.5, 0.7, 0.7]), 0.5, np.array([0, 1, 2])).tolist() == [1, 2, 0]
    assert non_max_suppression(same, np.array([0.5, 0.7, 0.7]), 1.0).tolist() == [1, 2, 0]  # IoU 1 is not above 1
    assert best_first(np.array([0.1, 0.3, 0.3, 0.2])).tolist() == [1, 2, 3, 0]
