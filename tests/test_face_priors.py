"""app/tasks/priors.py: ULFD's priors and decode against a computation written from their definition, the anchor
file's format and its errors, the scores' two forms, and the faces found through NMS."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.errors import ModelDirError
from app.tasks.priors import (BOXES_DECODED, BOXES_PRIORS, CENTERS_STRIDE, LOCATIONS_YX, LOGITS, PROBABILITIES,
                              ULTRA_LIGHT, AnchorSpec, Priors, PriorsError, boxes_form, check_outputs,
                              decode_faces, decode_landmarks, decode_locations, dequantize, face_probabilities,
                              load_anchors, parse_anchors, scores_form, ultra_light_priors)
from tests.conftest import ROOT

# ULFD's fd_config.define_img_size: input size -> (widths, heights) of its four feature maps, as it lists them
ULFD_TABLE = {128: ([16, 8, 4, 2], [12, 6, 3, 2]), 160: ([20, 10, 5, 3], [15, 8, 4, 2]),
              320: ([40, 20, 10, 5], [30, 15, 8, 4]), 480: ([60, 30, 15, 8], [45, 23, 12, 6]),
              640: ([80, 40, 20, 10], [60, 30, 15, 8]), 1280: ([160, 80, 40, 20], [120, 60, 30, 15])}
ULFD_SIZES = {128: (128, 96), 160: (160, 120), 320: (320, 240), 480: (480, 360), 640: (640, 480), 1280: (1280, 960)}
MIN_BOXES = [[10, 16, 24], [32, 48], [64, 96], [128, 192, 256]]


def priors_by_definition(width, height, maps_w, maps_h, min_boxes=MIN_BOXES, clamp=True):
    """One prior at a time, as the definition reads: per map, per row, per column, per min size."""
    out = []
    for k in range(len(maps_w)):
        for row in range(maps_h[k]):
            for column in range(maps_w[k]):
                for size in min_boxes[k]:
                    prior = [(column + 0.5) / maps_w[k], (row + 0.5) / maps_h[k], size / width, size / height]
                    out.append([min(max(v, 0.0), 1.0) for v in prior] if clamp else prior)
    return np.array(out)


def decode_by_definition(location, prior, cv=0.1, sv=0.2):
    lx, ly, lw, lh = location
    px, py, pw, ph = prior
    cx, cy = lx * cv * pw + px, ly * cv * ph + py
    w, h = math.exp(lw * sv) * pw, math.exp(lh * sv) * ph
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def test_ulfd_320x240_has_its_4420_priors_in_its_order():
    priors = ultra_light_priors()
    assert priors.boxes.shape == (4420, 4) and priors.boxes.dtype == np.float32
    expected = priors_by_definition(320, 240, [40, 20, 10, 5], [30, 15, 8, 4])
    np.testing.assert_allclose(priors.boxes, expected, rtol=0, atol=1e-7)
    # the first prior, the first of the second map, and the largest one's height clamped to 1 (256 / 240)
    np.testing.assert_allclose(priors.boxes[0], [0.5 / 40, 0.5 / 30, 10 / 320, 10 / 240], atol=1e-7)
    np.testing.assert_allclose(priors.boxes[3600], [0.5 / 20, 0.5 / 15, 32 / 320, 32 / 240], atol=1e-7)
    np.testing.assert_allclose(priors.boxes[-1], [4.5 / 5, 3.5 / 4, 256 / 320, 1.0], atol=1e-7)
    assert ULTRA_LIGHT.feature_maps() == ((40, 30), (20, 15), (10, 8), (5, 4))


@pytest.mark.parametrize("size", sorted(ULFD_TABLE))
def test_other_inputs_follow_ulfds_own_table(size):
    width, height = ULFD_SIZES[size]
    spec = ULTRA_LIGHT.for_input(width, height)
    widths, heights = ULFD_TABLE[size]
    assert spec.feature_maps() == tuple(zip(widths, heights))
    np.testing.assert_allclose(spec.priors().boxes, priors_by_definition(width, height, widths, heights), atol=1e-7)
    assert len(spec) == len(spec.priors())


def test_decode_matches_the_definition_prior_by_prior():
    priors = ultra_light_priors()
    rng = np.random.default_rng(3)
    locations = rng.normal(0, 1.5, (1, 4420, 4))
    corners = decode_locations(locations, priors)
    for i in rng.choice(4420, 300, replace=False):
        np.testing.assert_allclose(corners[i], decode_by_definition(locations[0, i], priors.boxes[i]), atol=1e-6)
    rows = np.array([7, 3, 4000])
    np.testing.assert_array_equal(decode_locations(locations, priors, rows), corners[rows])
    # zero locations: the priors themselves
    np.testing.assert_allclose(decode_locations(np.zeros((4420, 4)), priors), priors.corners(), atol=1e-7)


def test_tf_ordered_locations_decode_to_the_same_corners():
    priors = ultra_light_priors()
    yx = Priors(priors.boxes, locations=LOCATIONS_YX)
    locations = np.random.default_rng(4).normal(0, 1, (4420, 4))
    np.testing.assert_allclose(decode_locations(locations[:, [1, 0, 3, 2]], yx), decode_locations(locations, priors))


def test_landmarks_decode_as_retinaface_does():
    priors = ultra_light_priors()
    offsets = np.random.default_rng(5).normal(0, 1, (1, 4420, 10))
    points = decode_landmarks(offsets, priors)
    assert points.shape == (4420, 5, 2)
    i, k = 123, 3
    cx, cy, w, h = priors.boxes[i].astype(np.float64)
    dx, dy = offsets[0, i, 2 * k], offsets[0, i, 2 * k + 1]
    np.testing.assert_allclose(points[i, k], [cx + dx * 0.1 * w, cy + dy * 0.1 * h])


def test_softmax_and_logits_give_the_same_probabilities():
    logits = np.random.default_rng(6).normal(0, 4, (4420, 2))
    logits[0] = [-800.0, 800.0]  # no overflow either way
    logits[1] = [800.0, -800.0]
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(face_probabilities(logits, LOGITS), softmax[:, 1], atol=1e-12)
    np.testing.assert_allclose(face_probabilities(softmax, PROBABILITIES), softmax[:, 1])
    assert face_probabilities(logits, LOGITS)[[0, 1]].tolist() == [1.0, 0.0]


def test_scores_form_reads_the_tensors_range():
    softmax_int8 = np.random.default_rng(7).integers(-128, 128, (1, 4420, 2)).astype(np.int8)
    assert scores_form(softmax_int8, (1 / 256, -128)) == PROBABILITIES       # TFLite's int8 SOFTMAX output
    assert scores_form(softmax_int8.view(np.uint8), (1 / 256, 0)) == PROBABILITIES
    assert scores_form(softmax_int8, (0.0625, 0)) == LOGITS                  # [-8, 7.9]: logits
    assert scores_form(softmax_int8, (1 / 64, -128)) == LOGITS               # [0, 4]: not a probability
    p = np.random.default_rng(8).uniform(0, 1, 4420)
    assert scores_form(np.stack([1 - p, p], 1).astype(np.float32)) == PROBABILITIES
    assert scores_form(np.stack([-p, p], 1)) == LOGITS
    assert scores_form(np.stack([p / 2, p / 2], 1)) == LOGITS                # in [0, 1], rows not summing to 1
    assert scores_form(np.full((10, 2), np.nan)) == LOGITS


def test_dequantize_is_tflites():
    q = np.array([-128, -1, 0, 127], np.int8)
    expected = [float(np.float32(0.05) * np.float32(v + 1)) for v in (-128, -1, 0, 127)]
    assert dequantize(q, (0.05, -1)).tolist() == expected
    assert dequantize(np.array([0.5], np.float32)).tolist() == [0.5]


def encode(box, prior, cv=0.1, sv=0.2):
    """The location that decodes to `box` (corners) on `prior`: the inverse of the definition."""
    x1, y1, x2, y2 = box
    px, py, pw, ph = prior
    return [((x1 + x2) / 2 - px) / pw / cv, ((y1 + y2) / 2 - py) / ph / cv,
            math.log((x2 - x1) / pw) / sv, math.log((y2 - y1) / ph) / sv]


def test_faces_are_found_decoded_clipped_and_suppressed():
    priors = ultra_light_priors()
    locations = np.zeros((1, 4420, 4))
    scores = np.zeros((1, 4420, 2))
    scores[..., 0] = 1.0
    face = (0.30, 0.20, 0.45, 0.42)
    p_best, p_near, p_edge = 3600 + 2 * (5 * 20 + 7) + 1, 3600 + 2 * (5 * 20 + 8) + 1, 4419
    for index, box, score in ((p_best, face, 0.97), (p_near, (0.31, 0.21, 0.46, 0.43), 0.9),
                              (p_edge, (0.7, 0.5, 1.2, 1.1), 0.8)):
        locations[0, index] = encode(box, priors.boxes[index].astype(np.float64))
        scores[0, index] = [1 - score, score]
    faces = decode_faces(locations, scores, priors, min_score=0.5)
    assert len(faces) == 2  # the near one overlaps the best one by IoU > 0.3
    np.testing.assert_allclose(faces.scores, [0.97, 0.8], atol=1e-7)
    np.testing.assert_allclose(faces.boxes[0], [face[1], face[0], face[3], face[2]], atol=1e-6)
    np.testing.assert_allclose(faces.boxes[1], [0.5, 0.7, 1.0, 1.0], atol=1e-6)  # clipped to the input
    assert faces.landmarks is None
    assert len(decode_faces(locations, scores, priors, min_score=0.5, iou_threshold=0.99)) == 3
    assert len(decode_faces(locations, scores, priors, min_score=0.5, max_detections=1)) == 1
    assert len(decode_faces(locations, scores, priors, min_score=0.98)) == 0
    # the same faces from an is_test export: corners in the graph
    corners = decode_locations(locations, priors)[None]
    again = decode_faces(corners, scores, priors, min_score=0.5, form=BOXES_DECODED)
    np.testing.assert_allclose(again.boxes, faces.boxes, atol=1e-7)
    # and from logits
    logits = np.log(np.clip(scores, 1e-12, None))
    np.testing.assert_allclose(decode_faces(locations, logits, priors, min_score=0.5, scores_are=LOGITS).scores,
                               faces.scores, atol=1e-6)
    landmarks = np.zeros((1, 4420, 10))
    with_points = decode_faces(locations, scores, priors, min_score=0.5, landmarks=landmarks)
    np.testing.assert_allclose(with_points.landmarks[0], np.tile(priors.boxes[p_best, :2], (5, 1)), atol=1e-7)


def test_boxes_form_tells_decoded_corners_from_raw_locations():
    priors = ultra_light_priors()
    rng = np.random.default_rng(9)
    raw = rng.normal(0, 1, (1, 4420, 4))
    assert boxes_form(raw, priors) == BOXES_PRIORS
    assert boxes_form(np.zeros((1, 4420, 4)), priors) == BOXES_PRIORS
    assert boxes_form(decode_locations(raw, priors), priors) == BOXES_DECODED
    assert boxes_form(decode_locations(rng.normal(0, 3, (4420, 4)), priors), priors) == BOXES_DECODED
    with pytest.raises(PriorsError, match="4419 boxes for 4420 priors"):
        boxes_form(raw[:, 1:], priors)


def test_outputs_must_fit_the_priors():
    priors = ultra_light_priors()
    check_outputs(priors, [1, 4420, 4], [1, 4420, 2])
    check_outputs(4420, (1, 4420, 4), (1, 4420, 2), (1, 4420, 10))
    with pytest.raises(PriorsError, match=r"boxes output is \[1, 4420, 4\].*4 priors need \[1, 4, 4\]"):
        check_outputs(4, [1, 4420, 4], [1, 4420, 2])
    with pytest.raises(PriorsError, match="scores output"):
        check_outputs(priors, [1, 4420, 4], [1, 4420, 3])
    with pytest.raises(PriorsError, match="landmarks output"):
        check_outputs(priors, [1, 4420, 4], [1, 4420, 2], [1, 4420, 5])
    with pytest.raises(PriorsError, match="outputs of 4420 boxes and 10 scores for 4420 priors"):
        decode_faces(np.zeros((4420, 4)), np.zeros((10, 2)), priors, min_score=0.5)
    assert issubclass(PriorsError, ModelDirError)


ULFD_FILE = {"version": 1, "input": [320, 240],
             "layers": [{"stride": 8, "min_sizes": [10, 16, 24]}, {"stride": 16, "min_sizes": [32, 48]},
                        {"stride": 32, "min_sizes": [64, 96]}, {"stride": 64, "min_sizes": [128, 192, 256]}],
             "centers": "feature_map", "clip": True, "variances": [0.1, 0.2], "locations": "xywh"}


def test_an_anchor_file_of_ulfds_priors_is_ulfd(tmp_path):
    path = tmp_path / "anchors.json"
    path.write_text(json.dumps(ULFD_FILE))
    spec = load_anchors(path)
    assert spec == ULTRA_LIGHT and ULTRA_LIGHT.to_json() == ULFD_FILE
    assert parse_anchors(spec.to_json()) == spec
    np.testing.assert_array_equal(spec.priors().boxes, ultra_light_priors().boxes)
    minimal = {"input": [320, 240], "layers": ULFD_FILE["layers"]}
    assert parse_anchors(minimal) == ULTRA_LIGHT


def test_retinaface_style_anchors_centre_on_strides_and_are_not_clipped():
    spec = parse_anchors({"input": [100, 60], "centers": "stride", "clip": False,
                          "layers": [{"stride": 16, "min_sizes": [16, [32, 48]]}, {"stride": 32, "min_sizes": [256]}]})
    assert spec.centers == CENTERS_STRIDE and spec.feature_maps() == ((7, 4), (4, 2))
    boxes = spec.priors().boxes
    assert len(boxes) == 7 * 4 * 2 + 4 * 2 and len(spec) == len(boxes)
    np.testing.assert_allclose(boxes[0], [8 / 100, 8 / 60, 16 / 100, 16 / 60], atol=1e-7)
    np.testing.assert_allclose(boxes[1], [8 / 100, 8 / 60, 32 / 100, 48 / 60], atol=1e-7)
    np.testing.assert_allclose(boxes[2 * 7 * 4 - 1], [6.5 * 16 / 100, 3.5 * 16 / 60, 0.32, 0.8], atol=1e-7)
    np.testing.assert_allclose(boxes[-1], [3.5 * 32 / 100, 1.5 * 32 / 60, 2.56, 256 / 60], atol=1e-6)  # unclipped
    assert parse_anchors(spec.to_json()) == spec


def test_listed_boxes_are_taken_as_they_are():
    spec = parse_anchors({"input": [128, 128], "boxes": [[0.5, 0.5, 0.2, 0.3], [1.2, 0.1, 0.5, 0.5]], "clip": True})
    np.testing.assert_allclose(spec.priors().boxes, [[0.5, 0.5, 0.2, 0.3], [1.0, 0.1, 0.5, 0.5]], atol=1e-7)
    with pytest.raises(PriorsError, match="list their boxes or feature maps"):
        spec.for_input(256, 256)
    fixed = parse_anchors({"input": [64, 64], "layers": [{"stride": 8, "min_sizes": [8], "feature_map": [9, 9]}]})
    assert fixed.feature_maps() == ((9, 9),) and len(fixed.priors()) == 81
    with pytest.raises(PriorsError):
        fixed.for_input(128, 128)


@pytest.mark.parametrize("document, message", [
    ([], "a JSON object"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "min_size": 3}, r"unknown field\(s\) \['min_size'\]"),
    ({"version": 2, "input": [320, 240], "layers": ULFD_FILE["layers"]}, "version 2"),
    ({"layers": ULFD_FILE["layers"]}, "input: two numbers"),
    ({"input": [320, 0], "layers": ULFD_FILE["layers"]}, "input: two positive integers"),
    ({"input": [320.5, 240], "layers": ULFD_FILE["layers"]}, "input: two positive integers"),
    ({"input": [320, 240]}, "either `layers`"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "boxes": [[0.5, 0.5, 0.1, 0.1]]}, "not both"),
    ({"input": [320, 240], "layers": []}, "non-empty list"),
    ({"input": [320, 240], "layers": [{"stride": 8}]}, r"layers\[0\]: a layer needs"),
    ({"input": [320, 240], "layers": [{"stride": 0, "min_sizes": [8]}]}, r"layers\[0\]: stride"),
    ({"input": [320, 240], "layers": [{"stride": 8, "min_sizes": [8, "big"]}]}, r"min_sizes\[1\]"),
    ({"input": [320, 240], "layers": [{"stride": 8, "min_sizes": [8], "steps": 2}]}, r"unknown field\(s\) \['steps'\]"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "centers": "middle"}, "centers: one of"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "clip": "yes"}, "clip is true or false"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "variances": [0.1]}, "variances: two numbers"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "variances": [0.1, float("nan")]}, "variances"),
    ({"input": [320, 240], "layers": ULFD_FILE["layers"], "locations": "xyxy"}, "locations: one of"),
    ({"input": [320, 240], "boxes": [[0.5, 0.5, 0.1]]}, "four numbers"),
    ({"input": [320, 240], "boxes": [[0.5, 0.5, 0.1, 0.1], [0.5, 0.5, 0.0, 0.1]]}, r"boxes\[1\]: a box is finite"),
    ({"input": [320, 240], "boxes": "all"}, "non-empty list"),
    ({"input": [1 << 20, 1 << 20], "layers": [{"stride": 1, "min_sizes": [8]}]}, "a prior set has 1 to"),
])
def test_a_bad_anchor_file_says_what_is_wrong(document, message):
    with pytest.raises(PriorsError, match=message):
        parse_anchors(document, "anchors.json")


def test_an_unreadable_anchor_file_says_so(tmp_path):
    with pytest.raises(PriorsError, match="cannot read"):
        load_anchors(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PriorsError, match="bad.json: not JSON"):
        load_anchors(tmp_path / "bad.json")
    (tmp_path / "latin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PriorsError, match="cannot read"):
        load_anchors(tmp_path / "latin.json")


def test_an_empty_prior_set_cannot_be_made():
    with pytest.raises(PriorsError):
        parse_anchors({"input": [8, 8], "boxes": []})
    assert len(AnchorSpec((8, 8), boxes=((0.5, 0.5, 1.0, 1.0),)).priors()) == 1


def test_the_anchor_file_docs_faces_md_shows_is_ulfds():
    page = (ROOT / "docs" / "faces.md").read_text(encoding="utf-8")
    block = page.split("```json\n", 1)[1].split("```", 1)[0]
    assert parse_anchors(json.loads(block), "docs/faces.md") == ULTRA_LIGHT
