"""app/tasks/yolo.py: each YOLO layout decodes as an independent decode written here, in loops, straight from the
layout's definition (no code shared with the module), on random and on structured outputs (known boxes).

The reference below reads one candidate at a time: dequantize as TFLite does (float32 of scale x (q - zero
point)), the best class (the first of equal ones), the score (the sigmoid for logits; objectness x class for
YOLOv5), the box from its definition (xywh or corners; DFL: per side a softmax over the bins, the expected bin,
the anchor at the cell's centre), then greedy NMS over the candidates sorted by score, equal scores in
candidate order, suppressing (same class, unless agnostic) an IoU strictly above the threshold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.model_dir.schema import DetectionSpec
from app.tasks import yolo
from app.tasks.yolo import BOX_DISTRIBUTIONS, CLASS_LOGITS, PREDICTIONS, DecodeError, Raw, Rows, decode

# ---- the independent decode ----------------------------------------------------------------------------------


def real(q, scale, zero_point) -> float:
    if scale is None:
        return float(np.float32(q))
    return float(np.float32(float(np.float32(scale)) * (int(q) - int(zero_point))))


def activate(x: float, activation: str) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if activation == "sigmoid" else x


def iou(a, b) -> float:
    """TFLite's ComputeIntersectionOverUnion on (y1, x1, y2, x2) corners."""
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if area_a <= 0 or area_b <= 0:
        return 0.0
    height = max(min(a[2], b[2]) - max(a[0], b[0]), 0.0)
    width = max(min(a[3], b[3]) - max(a[1], b[1]), 0.0)
    inter = height * width
    return inter / (area_a + area_b - inter)


def greedy_nms(candidates, iou_threshold, agnostic, max_detections):
    """candidates: (index, box, class, score) -> kept, best first."""
    ordered = sorted(candidates, key=lambda c: (-c[3], c[0]))
    kept = []
    for candidate in ordered:
        if len(kept) == max_detections:
            break
        if all(iou(k[1], candidate[1]) <= iou_threshold or (not agnostic and k[2] != candidate[2]) for k in kept):
            kept.append(candidate)
    return kept


def reference_yolo(values, scale, zero_point, spec, width, height, min_score, max_detections):
    """Ultralytics' one tensor, candidate by candidate."""
    attributes = 4 + (1 if spec.objectness else 0) + spec.classes
    flat = values.reshape(-1)
    n = flat.size // attributes

    def at(attribute, j):
        index = attribute * n + j if spec.layout == "attributes_first" else j * attributes + attribute
        return real(flat[index], scale, zero_point)

    candidates = []
    for j in range(n):
        first_class = 5 if spec.objectness else 4
        class_scores = [activate(at(first_class + c, j), spec.score_activation) for c in range(spec.classes)]
        best = max(class_scores)
        label = class_scores.index(best)
        score = best * activate(at(4, j), spec.score_activation) if spec.objectness else best
        if not score >= min_score:
            continue
        a, b, c, d = (at(i, j) for i in range(4))
        if spec.box_format == "xywh":
            x1, y1, x2, y2 = a - c / 2, b - d / 2, a + c / 2, b + d / 2
        else:
            x1, y1, x2, y2 = a, b, c, d
        if spec.box_scale == "pixels":
            x1, x2, y1, y2 = x1 / width, x2 / width, y1 / height, y2 / height
        candidates.append((j, (y1, x1, y2, x2), label, score))
    return greedy_nms(candidates, spec.nms_iou, spec.class_agnostic, max_detections)


def reference_dfl(logits, logits_q, bins, bins_q, spec, width, height, min_score, max_detections):
    """Frigate's Coral pair, anchor by anchor."""
    anchors = []
    for stride in spec.strides:
        for row in range(height // stride):
            for col in range(width // stride):
                anchors.append((col + 0.5, row + 0.5, stride))
    logits, bins = logits.reshape(len(anchors), -1), bins.reshape(len(anchors), -1)
    candidates = []
    for j, (ax, ay, stride) in enumerate(anchors):
        class_logits = [real(v, *logits_q) for v in logits[j]]
        best = max(class_logits)
        score = activate(best, spec.score_activation)
        if not score >= min_score:
            continue
        distances = []
        for side in range(4):
            side_bins = [real(v, *bins_q) for v in bins[j, side * spec.reg_max:(side + 1) * spec.reg_max]]
            top = max(side_bins)
            weights = [math.exp(v - top) for v in side_bins]
            distances.append(sum(k * w for k, w in enumerate(weights)) / sum(weights))
        left, up, right, down = distances
        box = ((ay - up) * stride / height, (ax - left) * stride / width,
               (ay + down) * stride / height, (ax + right) * stride / width)
        candidates.append((j, box, class_logits.index(best), score))
    return greedy_nms(candidates, spec.nms_iou, spec.class_agnostic, max_detections)


def assert_same(rows: Rows, expected, atol=1e-6):
    assert len(rows) == len(expected), (len(rows), len(expected))
    if not expected:
        return
    np.testing.assert_allclose(rows.boxes, np.array([e[1] for e in expected]), atol=atol)
    assert rows.classes.tolist() == [e[2] for e in expected]
    np.testing.assert_allclose(rows.scores, [e[3] for e in expected], atol=atol)


# ---- specs and tensors ---------------------------------------------------------------------------------------

def yolo_spec(**given) -> DetectionSpec:
    return DetectionSpec(**{"decoder": "yolo", "classes": 3, "layout": "attributes_first",
                            "box_scale": "normalized", **given})


def dfl_spec(**given) -> DetectionSpec:
    return DetectionSpec(**{"decoder": "yolo_dfl", "classes": 3, **given})


QUANTIZATIONS = {"int8": (np.int8, 1 / 255, -128), "uint8": (np.uint8, 1 / 255, 0), "float32": (np.float32, None, None)}


def random_tensor(rng, shape, kind, low=-128, high=128):
    dtype, scale, zero_point = QUANTIZATIONS[kind]
    if kind == "float32":
        return rng.uniform(0, 1, shape).astype(np.float32), scale, zero_point
    offset = 0 if kind == "int8" else 128
    return (rng.integers(low, high, shape) + offset).astype(dtype), scale, zero_point


# ---- Ultralytics' one tensor -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int8", "uint8", "float32"])
@pytest.mark.parametrize("layout", ["attributes_first", "anchors_first"])
@pytest.mark.parametrize("seed", range(3))
def test_yolo_equals_the_definition_on_random_outputs(kind, layout, seed):
    rng = np.random.default_rng(seed)
    n, classes = 84, 5
    spec = yolo_spec(classes=classes, layout=layout, min_score=0.3, nms_iou=0.5, max_detections=20)
    shape = (1, 4 + classes, n) if layout == "attributes_first" else (1, n, 4 + classes)
    values, scale, zero_point = random_tensor(rng, shape, kind)
    rows = decode(spec, {PREDICTIONS: Raw(values, scale, zero_point)}, 64, 64)
    expected = reference_yolo(values, scale, zero_point, spec, 64, 64, 0.3, 20)
    assert 0 < len(expected) <= 20
    assert_same(rows, expected)


@pytest.mark.parametrize("given", [
    dict(box_scale="pixels"), dict(box_format="xyxy"), dict(objectness=True), dict(score_activation="sigmoid"),
    dict(class_agnostic=True), dict(objectness=True, layout="anchors_first", box_scale="pixels"),
])
def test_yolo_variants_equal_the_definition(given):
    rng = np.random.default_rng(7)
    spec = yolo_spec(classes=4, min_score=0.2, max_detections=50, **given)
    attributes = yolo.yolo_attributes(spec)
    shape = (1, attributes, 100) if spec.layout == "attributes_first" else (1, 100, attributes)
    values = rng.integers(-128, 128, shape).astype(np.int8)
    scale, zero_point = (0.5 if spec.box_scale == "pixels" else 1 / 255), -128
    if spec.score_activation == "sigmoid":
        scale, zero_point = 0.05, 0
    rows = decode(spec, {PREDICTIONS: Raw(values, scale, zero_point)}, 96, 80)
    expected = reference_yolo(values, scale, zero_point, spec, 96, 80, 0.2, 50)
    assert expected
    assert_same(rows, expected)


def place(table: np.ndarray, layout: str, j: int, attributes: list[float]) -> None:
    """Candidate j's attributes (float32 tensor [1, A, N] or [1, N, A])."""
    if layout == "attributes_first":
        table[0, :, j] = attributes
    else:
        table[0, j, :] = attributes


@pytest.mark.parametrize("layout", ["attributes_first", "anchors_first"])
def test_yolo_places_known_boxes(layout):
    """Three objects on a 320x240 input, boxes xywh in pixels; the rest of the 300 candidates score 0.01."""
    spec = yolo_spec(classes=3, layout=layout, box_scale="pixels")
    shape = (1, 7, 300) if layout == "attributes_first" else (1, 300, 7)
    table = np.zeros(shape, np.float32)
    table[(0, slice(4, 7)) if layout == "attributes_first" else (0, slice(None), slice(4, 7))] = 0.01
    place(table, layout, 10, [160, 120, 64, 48, 0.9, 0.1, 0.1])    # class 0 at the centre
    place(table, layout, 11, [162, 121, 64, 48, 0.8, 0.1, 0.1])    # the same object, worse: suppressed
    place(table, layout, 200, [32, 24, 32, 16, 0.1, 0.1, 0.7])     # class 2, top left
    place(table, layout, 299, [160, 120, 64, 48, 0.1, 0.6, 0.1])   # class 1 on the first: another class, kept
    rows = decode(spec, {PREDICTIONS: Raw(table)}, 320, 240)
    assert rows.classes.tolist() == [0, 2, 1]
    np.testing.assert_allclose(rows.scores, [0.9, 0.7, 0.6], rtol=1e-6)
    np.testing.assert_allclose(rows.boxes, [[96 / 240, 128 / 320, 144 / 240, 192 / 320],
                                            [16 / 240, 16 / 320, 32 / 240, 48 / 320],
                                            [96 / 240, 128 / 320, 144 / 240, 192 / 320]], rtol=1e-6)
    agnostic = decode(yolo_spec(classes=3, layout=layout, box_scale="pixels", class_agnostic=True),
                      {PREDICTIONS: Raw(table)}, 320, 240)
    assert agnostic.classes.tolist() == [0, 2]  # class 1's box is class 0's: suppressed across classes


def test_yolo_thresholds_are_honoured_at_their_edges():
    table = np.zeros((1, 5, 6), np.float32)      # one class; boxes normalized xywh, all exact in binary
    table[0, :, 0] = [0.5, 0.5, 0.25, 0.25, 0.5]    # exactly min_score: kept (>=)
    table[0, :, 1] = [0.1, 0.1, 0.1, 0.1, np.nextafter(np.float32(0.5), np.float32(0))]  # just under: dropped
    # half of candidate 0's width, the same height: IoU exactly 1/3, the threshold: not suppressed (>)
    table[0, :, 2] = [0.625, 0.5, 0.25, 0.25, 0.6]
    table[0, :, 3] = [0.875, 0.875, 0.125, 0.125, 0.55]
    table[0, :, 4] = [0.875, 0.875, 0.125, 0.125, 0.55]  # a tie with candidate 3, the same box: the first wins
    table[0, :, 5] = [np.nan, 0.25, 0.125, 0.125, np.nan]  # NaN never passes
    raw = {PREDICTIONS: Raw(table)}
    spec = yolo_spec(classes=1, min_score=0.5, nms_iou=1 / 3)
    rows = decode(spec, raw, 10, 10)
    assert rows.scores.tolist() == pytest.approx([0.6, 0.55, 0.5])
    np.testing.assert_array_equal(rows.boxes[1], [0.8125, 0.8125, 0.9375, 0.9375])
    assert_same(rows, reference_yolo(table, None, None, spec, 10, 10, 0.5, 100))
    tighter = decode(yolo_spec(classes=1, min_score=0.5, nms_iou=0.33), raw, 10, 10)
    assert tighter.scores.tolist() == pytest.approx([0.6, 0.55])  # 1/3 > 0.33: candidate 0 suppressed
    assert len(decode(spec, raw, 10, 10, max_detections=2)) == 2
    assert len(decode(spec, raw, 10, 10, min_score=0.56)) == 1
    assert len(decode(spec, raw, 10, 10, min_score=0.9)) == 0


def test_equal_scores_go_in_candidate_order():
    table = np.zeros((1, 5, 4), np.float32)
    for j, x in enumerate((0.1, 0.3, 0.5, 0.7)):
        table[0, :, j] = [x, 0.5, 0.1, 0.1, 0.75]
    rows = decode(yolo_spec(classes=1), {PREDICTIONS: Raw(table)}, 10, 10)
    np.testing.assert_allclose(rows.boxes[:, 1], [0.05, 0.25, 0.45, 0.65], rtol=1e-6)
    table[0, 4, 2] = 0.75 + 1e-3
    assert decode(yolo_spec(classes=1), {PREDICTIONS: Raw(table)}, 10, 10).boxes[0, 1] == pytest.approx(0.45)


def test_the_first_of_equal_class_scores_names_the_class():
    table = np.zeros((1, 7, 1), np.float32)
    table[0, :, 0] = [0.5, 0.5, 0.2, 0.2, 0.1, 0.8, 0.8]
    assert decode(yolo_spec(classes=3), {PREDICTIONS: Raw(table)}, 10, 10).classes.tolist() == [1]


def test_nothing_over_min_score_is_an_empty_result():
    values = np.full((1, 84, 2100), -128, np.int8)   # every score 0
    rows = decode(yolo_spec(classes=80), {PREDICTIONS: Raw(values, 1 / 255, -128)}, 320, 320)
    assert len(rows) == 0 and rows.boxes.shape == (0, 4) and rows.boxes.dtype == np.float32
    assert len(decode(yolo_spec(classes=80), {PREDICTIONS: Raw(values, 1 / 255, -128)}, 320, 320, min_score=0))


def test_a_tensor_that_does_not_fit_is_a_decode_error():
    with pytest.raises(DecodeError, match="does not hold 9 values"):
        decode(yolo_spec(classes=5), {PREDICTIONS: Raw(np.zeros((1, 8, 10), np.float32))}, 10, 10)


# ---- Frigate's Coral pair ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int8", "uint8"])
@pytest.mark.parametrize("seed", range(3))
def test_dfl_equals_the_definition_on_random_outputs(kind, seed):
    rng = np.random.default_rng(seed)
    width, height, classes = 64, 96, 4
    n = yolo.anchor_count(width, height, (8, 16, 32))
    assert n == 8 * 12 + 4 * 6 + 2 * 3
    spec = dfl_spec(classes=classes, min_score=0.6, max_detections=30)
    dtype = np.int8 if kind == "int8" else np.uint8
    offset = 0 if kind == "int8" else 128
    logits = (rng.integers(-128, 128, (1, n, classes)) + offset).astype(dtype)
    bins = (rng.integers(-128, 128, (1, n, 64)) + offset).astype(dtype)
    logits_q, bins_q = (0.02, 0 + offset), (0.05, -10 + offset)
    rows = decode(spec, {CLASS_LOGITS: Raw(logits, *logits_q), BOX_DISTRIBUTIONS: Raw(bins, *bins_q)}, width, height)
    expected = reference_dfl(logits, logits_q, bins, bins_q, spec, width, height, 0.6, 30)
    assert expected
    assert_same(rows, expected)


def test_dfl_float_tensors_and_other_strides():
    rng = np.random.default_rng(3)
    spec = dfl_spec(classes=2, strides=[16, 32], reg_max=8, class_agnostic=True, min_score=0.55)
    n = yolo.anchor_count(64, 64, (16, 32))
    logits = rng.normal(0, 1, (1, n, 2)).astype(np.float32)
    bins = rng.normal(0, 2, (1, n, 32)).astype(np.float32)
    rows = decode(spec, {CLASS_LOGITS: Raw(logits), BOX_DISTRIBUTIONS: Raw(bins)}, 64, 64)
    assert_same(rows, reference_dfl(logits, (None, None), bins, (None, None), spec, 64, 64, 0.55, 100))


def test_dfl_places_known_boxes():
    """Peaked bins put each side at a known number of cells: the boxes come out where they were put."""
    width = height = 64
    n = yolo.anchor_count(width, height, (8, 16, 32))   # 64 + 16 + 4
    logits = np.full((1, n, 3), -10.0, np.float32)
    bins = np.zeros((1, n, 4, 16), np.float32)

    def put(anchor, label, logit, sides):
        logits[0, anchor, label] = logit
        for side, cells in enumerate(sides):
            bins[0, anchor, side, cells] = 60.0  # e^-60 elsewhere: the expected bin is `cells`

    put(9, 0, 2.0, (1, 1, 1, 1))     # stride 8, row 1, col 1: centre (12, 12), 16x16 around it
    put(64 + 5, 1, 1.0, (0, 1, 2, 3))  # stride 16, row 1, col 1: centre (24, 24)
    put(80 + 3, 2, 3.0, (1, 1, 0, 0))  # stride 32, row 1, col 1: centre (48, 48)
    spec = dfl_spec(classes=3, min_score=0.5)
    rows = decode(spec, {CLASS_LOGITS: Raw(logits), BOX_DISTRIBUTIONS: Raw(bins.reshape(1, n, 64))}, width, height)
    assert rows.classes.tolist() == [2, 0, 1]
    np.testing.assert_allclose(rows.scores, [1 / (1 + math.exp(-s)) for s in (3.0, 2.0, 1.0)], rtol=1e-6)
    np.testing.assert_allclose(rows.boxes * 64, [[16, 16, 48, 48], [4, 4, 20, 20], [8, 24, 72, 56]], atol=1e-9)


def test_dfl_tensors_that_do_not_fit_the_anchors_are_a_decode_error():
    with pytest.raises(DecodeError, match="do not fit 84 anchors"):
        decode(dfl_spec(), {CLASS_LOGITS: Raw(np.zeros((1, 80, 3), np.float32)),
                            BOX_DISTRIBUTIONS: Raw(np.zeros((1, 80, 64), np.float32))}, 64, 64)


def test_the_anchors_are_grid_cell_centres_stride_by_stride():
    centres, strides = yolo.anchors(32, 16, (8, 16))
    assert centres.tolist()[:5] == [[0.5, 0.5], [1.5, 0.5], [2.5, 0.5], [3.5, 0.5], [0.5, 1.5]]
    assert strides.tolist() == [8.0] * 8 + [16.0] * 2 and centres.tolist()[8:] == [[0.5, 0.5], [1.5, 0.5]]
    assert yolo.anchor_count(320, 320, (8, 16, 32)) == 2100 and yolo.anchor_count(640, 640, (8, 16, 32)) == 8400


def test_the_bench_runs_and_prints_its_table():
    """bench/yolo_decode.py on a few rounds, in its own process (it pins BLAS to one thread): a row per layout with
    its figures (no timing is asserted)."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "yolo_decode.py"
    done = subprocess.run([sys.executable, str(bench), "-n", "4", "--scenes", "2", "--warmup", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("YOLO decode + NMS, 320x320, 2100 candidates, 80 classes")
    rows = {line.split("  ")[0]: line.split() for line in lines[2:5]}
    assert set(rows) == {"ultralytics [1,84,2100]", "ultralytics [1,2100,84]", "frigate logits+DFL"}
    for name, row in rows.items():
        over, kept = float(row[-6]), float(row[-5])
        assert 30 <= over <= 1000 and 3 <= kept <= 100, (name, row)  # a few objects, each lighting some anchors
    assert lines[5].startswith("target: decode + NMS under 2.0 ms on one core")
