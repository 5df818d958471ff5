"""TFLite_Detection_PostProcess on the emulator: the same bytes as the pinned runtime's own kernel.

Every row the kernel writes is compared byte for byte (float32, to the sign of zero), in fast and
regular NMS, for each option and each trap: ties (stable sort, argmax, libstdc++'s partial_sort),
double-precision decoding with the C library's exp, uint8 dequantization that depends on the
position, the background column, unclipped boxes, quantized anchors, thresholds met exactly, rows
left unwritten. Graphs of the op alone run in this process (the kernel fails with an error, it does
not abort); whole detectors run through the reference worker subprocess, like every emulator test.
"""

from __future__ import annotations

import subprocess
import sys

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as RealInterpreter
from ai_edge_litert.interpreter import OpResolverType

from app.detection_postprocess import OUTPUT_ROLES
from app.emulator import Interpreter, InvokeFailed, UnsupportedOperators, libm
from app.emulator.kernels.detection import decreasing_partial_arg_sort
from tests.conftest import ROOT
from tests.detection_models import (DEFAULT_OPTIONS, ENCODINGS_Q, OUTPUT_ORDERS, SCORES_Q, grid_anchors,
                                    postprocess_alone, square_image, ssd_anchors, ssd_like_head, tiny_detector)
from tests.emulator_cases import reference  # noqa: F401 (fixture)
from tests.emulator_cases import run_emulator

f32 = np.float32


def run_kernel(model: bytes, inputs: list[np.ndarray], resolver: str = "BUILTIN_REF",
               num_threads: int | None = 1) -> list[np.ndarray]:
    interpreter = RealInterpreter(model_content=model, num_threads=num_threads,
                                  experimental_op_resolver_type=getattr(OpResolverType, resolver))
    interpreter.allocate_tensors()
    for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
        interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def written_rows(options: dict, count: int) -> np.ndarray:
    """The rows of boxes, classes and scores the kernel writes: regular NMS the first max_detections (zeros past
    the count); fast NMS each detection's first min(max_classes_per_detection, num_classes) rows."""
    options = {**DEFAULT_OPTIONS, **options}
    per_anchor = options["max_classes_per_detection"]
    rows = np.arange(options["max_detections"] * per_anchor)
    if options["use_regular_nms"]:
        return rows < options["max_detections"]
    return (rows // per_anchor < count) & (rows % per_anchor < min(per_anchor, options["num_classes"]))


def by_role(outputs: list[np.ndarray], order: str = "tf1") -> dict[str, np.ndarray]:
    return dict(zip(OUTPUT_ORDERS[order], outputs, strict=True))


def assert_same_detections(expected: list[np.ndarray], got: list[np.ndarray], options: dict, order: str = "tf1",
                           zeros_elsewhere: bool = True) -> dict[str, np.ndarray]:
    """Equal bytes in every row the kernel writes, zeros in the emulator's other rows; the kernel's outputs by role."""
    expected, got = by_role(expected, order), by_role(got, order)
    for role in OUTPUT_ROLES:
        assert got[role].dtype == expected[role].dtype == np.float32
        assert got[role].shape == expected[role].shape, role
    assert got["count"].tobytes() == expected["count"].tobytes(), (got["count"], expected["count"])
    written = written_rows(options, int(expected["count"][0]))
    for role in ("boxes", "classes", "scores"):
        ours, theirs = got[role][0][written], expected[role][0][written]
        assert ours.tobytes() == theirs.tobytes(), f"{role}: emulator {ours.tolist()}, kernel {theirs.tolist()}"
        if zeros_elsewhere:
            assert not got[role][0][~written].any(), f"{role}: rows the kernel leaves unwritten are not zero here"
    return expected


def check(model: bytes, inputs: list[np.ndarray], options: dict, order: str = "tf1") -> dict[str, np.ndarray]:
    return assert_same_detections(run_kernel(model, inputs), run_emulator(model, inputs), options, order)


# ---- random op-alone graphs ----

def random_case(seed: int, regular: bool, ties: bool, large: bool = False):
    """A graph of the op alone with random types, quantization, options and inputs; `ties` draws scores from a
    few levels and boxes from a coarse grid, so equal scores and equal overlaps are everywhere."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(100, 400)) if large else int(rng.integers(1, 48))
    num_classes = int(rng.integers(1, 10))
    columns = num_classes + int(rng.integers(0, 2))
    encodings_type, predictions_type = rng.choice(["FLOAT32", "UINT8"], 2)
    levels = [0.0, 0.25, 0.5, 0.75]
    options = dict(
        max_detections=int(rng.integers(1 if regular else 0, 60 if large else 12)),
        max_classes_per_detection=int(rng.integers(1, 5)), detections_per_class=int(rng.integers(1, 8)),
        use_regular_nms=regular, num_classes=num_classes,
        nms_score_threshold=float(rng.choice(levels + [rng.random()])) if ties else float(rng.random() * 0.8),
        nms_iou_threshold=float(rng.choice([0.5, 1.0, 1 / 3, 0.25, rng.random() * 0.99 + 0.01])),
        **{key: float(rng.choice([default, 1.0, rng.random() * 10 + 0.5]))
           for key, default in (("y_scale", 10.0), ("x_scale", 10.0), ("h_scale", 5.0), ("w_scale", 5.0))})
    if ties:
        anchors = np.concatenate([rng.integers(0, 4, (n, 2)) / 4, rng.choice([0.25, 0.5], (n, 2))], axis=1)
    else:
        anchors = np.concatenate([rng.random((n, 2)), rng.random((n, 2)) * 0.5 + 0.01], axis=1)
    anchors = anchors.astype(f32)
    quantization = {}
    if encodings_type == "UINT8":
        quantization["anchors_q"] = (float(rng.choice([1 / 256, rng.random() * 0.01 + 0.001])),
                                     int(rng.integers(0, 20)))
        quantization["encodings_q"] = (float(rng.random() * 0.2 + 0.01), int(rng.integers(100, 156)))
        zero_point = quantization["encodings_q"][1]
        if rng.random() > 0.15:  # else float anchors: read as bytes, with scale 0
            scale, anchor_zero_point = quantization["anchors_q"]
            anchors = np.clip(np.round(anchors / scale) + anchor_zero_point, 0, 255).astype(np.uint8)
        low, high = (zero_point - 3, zero_point + 4) if ties else (0, 256)
        encodings = rng.integers(low, high, (1, n, 4)).astype(np.uint8)
    else:
        encodings = (rng.integers(-2, 3, (1, n, 4)) * 0.5 if ties else rng.normal(0, 1, (1, n, 4))).astype(f32)
    if predictions_type == "UINT8":
        quantization["predictions_q"] = (float(rng.choice([1 / 256, 1 / 255, rng.random() * 0.02 + 0.001])),
                                         int(rng.integers(0, 40)))
        predictions = (rng.choice([0, 64, 128, 192, 255], (1, n, columns)) if ties
                       else rng.integers(0, 256, (1, n, columns))).astype(np.uint8)
    else:
        predictions = (rng.choice(levels + [1.0], (1, n, columns)) if ties else rng.random((1, n, columns))).astype(f32)
    model = postprocess_alone(anchors, columns, encodings=str(encodings_type), predictions=str(predictions_type),
                              **quantization, **options)
    return model, [encodings, predictions], options


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_random_graphs_of_the_op_alone(regular, ties):
    detections = 0
    for seed in range(150):
        model, inputs, options = random_case(seed, regular, ties)
        detections += int(check(model, inputs, options)["count"][0])
    assert detections > 300  # the cases detect things, they are not all empty


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_hundreds_of_overlapping_boxes(regular):
    """Long candidate lists, many suppressed: the emulator decides them a block at a time."""
    for seed in range(40):
        model, inputs, options = random_case(1000 + seed, regular, ties=seed % 2 == 0, large=True)
        check(model, inputs, options)


@pytest.mark.parametrize("regular,max_detections", [(False, 10), (False, 100), (True, 100)])
@pytest.mark.parametrize("anchor_type", ["FLOAT32", "UINT8"])
def test_ssd_mobilenet_size(regular, max_detections, anchor_type):
    """1917 anchors, 90 classes and the background, uint8 inputs as Coral's SSD MobileNet hands them over."""
    anchors = ssd_anchors()
    if anchor_type == "UINT8":
        anchors = np.clip(np.round(anchors * 128), 0, 255).astype(np.uint8)
    options = dict(max_detections=max_detections, num_classes=90, use_regular_nms=regular, detections_per_class=100,
                   nms_score_threshold=1e-8, nms_iou_threshold=0.6)
    model = postprocess_alone(anchors, 91, encodings="UINT8", predictions="UINT8", encodings_q=ENCODINGS_Q,
                              predictions_q=SCORES_Q, anchors_q=(1 / 128, 0), **options)
    for seed in range(2):
        kernel = check(model, list(ssd_like_head(seed, ssd_anchors(), 90)), options)
        assert kernel["count"][0] == max_detections


def test_nan_and_infinite_inputs_go_where_the_kernel_sends_them():
    """Float inputs with NaN, inf and signed zeros: NaN scores are never kept and never an anchor's best (unless all
    are NaN), NaN boxes overlap nothing, infinite boxes are valid."""
    special = [0.1, 0.5, 0.9, np.nan, -np.inf, np.inf, 0.0, -0.0]
    for seed in range(150):
        rng = np.random.default_rng(seed)
        n, num_classes = int(rng.integers(1, 30)), int(rng.integers(1, 12))
        columns = num_classes + int(rng.integers(0, 2))
        options = dict(max_detections=int(rng.integers(1, 8)), max_classes_per_detection=int(rng.integers(1, 4)),
                       num_classes=num_classes, use_regular_nms=bool(seed % 2), nms_iou_threshold=0.5,
                       detections_per_class=int(rng.integers(1, 5)),
                       nms_score_threshold=float(rng.choice([0.0, -np.inf, 0.3])))
        anchors = np.concatenate([rng.random((n, 2)), rng.random((n, 2)) * 0.5 + 0.01], axis=1).astype(f32)
        if seed % 3 == 0:
            anchors[rng.integers(n), rng.integers(4)] = rng.choice([np.nan, np.inf])
        encodings = rng.normal(0, 1, (1, n, 4)).astype(f32)
        odd = rng.random((1, n, 4)) < 0.1
        encodings[odd] = rng.choice([np.nan, np.inf, -np.inf, 1000.0], size=int(odd.sum()))
        scores = rng.choice(special, size=(1, n, columns)).astype(f32)
        if seed % 5 == 0:
            scores[0, rng.integers(n)] = np.nan  # an anchor whose scores are all NaN
        check(postprocess_alone(anchors, columns, **options), [encodings, scores], options)


def test_a_nan_in_argmaxs_first_lane_hides_the_anchor():
    """ArgMaxVector's horizontal step ((v0 < v1) ? v1 : v0, ...) keeps a NaN from lane 0, and then returns index 0:
    with scores [NaN, 0.2, 0.9, 0.1] the anchor's best is NaN, never kept; with 5 classes the leftover 0.3 wins."""
    for row, count, best in (([np.nan, 0.2, 0.9, 0.1], 0, None), ([np.nan, 0.2, 0.9, 0.1, 0.3], 1, 4),
                             ([0.2, np.nan, 0.9, 0.1], 1, 2)):
        model, inputs, options = one_box_per_anchor([[0.5, 0.5, 0.2, 0.2]], [[0.0, *row]], max_detections=1)
        kernel = check(model, inputs, options)
        assert kernel["count"][0] == count
        if count:
            assert kernel["classes"][0, 0] == best


def test_the_default_resolver_runs_the_same_kernel():
    """AUTO (XNNPACK, which takes no custom op) and the optimized builtins give BUILTIN_REF's bytes, rows unwritten
    aside."""
    for seed in range(60):
        model, inputs, options = random_case(seed, regular=seed % 2 == 1, ties=seed % 3 == 0)
        reference_outputs = run_kernel(model, inputs)
        for resolver in ("AUTO", "BUILTIN"):
            assert_same_detections(reference_outputs, run_kernel(model, inputs, resolver, None), options,
                                   zeros_elsewhere=False)


# ---- whole detectors ----

@pytest.mark.parametrize("scales", [1, 2])
@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
@pytest.mark.parametrize("order", sorted(OUTPUT_ORDERS))
def test_tiny_detectors_every_tensor(reference, order, feed, scales):
    """QUANTIZE, CONV_2D, RESHAPE, CONCATENATION, LOGISTIC, DEQUANTIZE as detectors use them, then the op; outputs in
    the file's order."""
    size = 32 if scales == 2 else 16
    model = tiny_detector(size=size, order=order, feed=feed, scales=scales)
    emulator = Interpreter(model_content=model)
    emulator.allocate_tensors()
    real = RealInterpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    assert [(d["name"], d["index"]) for d in emulator.get_output_details()] == \
           [(d["name"], d["index"]) for d in real.get_output_details()]
    rng = np.random.default_rng(0)
    images = [square_image(size, 4, 8, 8), square_image(size, 0, 0, size // 2), np.zeros((size, size, 3), np.uint8),
              rng.integers(0, 256, (size, size, 3)).astype(np.uint8)]
    postprocess = emulator.plan.steps[-1]
    for image in images:
        x = image[None]
        expected = reference.run(model, [x], all_tensors=True)
        emulator.set_tensor(emulator.get_input_details()[0]["index"], x)
        emulator.invoke()
        for step in emulator.plan.steps[:-1]:
            for index in step.outputs:
                assert emulator.get_tensor(index).tobytes() == expected[index].tobytes(), step.operator.opcode
        outputs = [d["index"] for d in emulator.get_output_details()]
        assert set(outputs) == set(postprocess.outputs)
        assert_same_detections([expected[i] for i in outputs], [emulator.get_tensor(i) for i in outputs], {}, order)


def test_a_blank_image_detects_nothing():
    model = tiny_detector()
    kernel = check(model, [np.zeros((1, 16, 16, 3), np.uint8)], {})
    assert kernel["count"][0] == 0


# ---- the traps, one by one ----

def one_box_per_anchor(anchors: np.ndarray, scores: list[list[float]], **options) -> tuple[bytes, list, dict]:
    """Float inputs, encodings 0: each box is exactly its anchor. scores: per anchor, one per column."""
    columns = len(scores[0])
    options = {"num_classes": columns - 1, **options}
    model = postprocess_alone(np.asarray(anchors, f32), columns, **options)
    inputs = [np.zeros((1, len(anchors), 4), f32), np.array([scores], f32)]
    return model, inputs, options


APART = [[0.1 + 0.2 * i, 0.5, 0.1, 0.1] for i in range(5)]  # five anchors that do not overlap


def test_equal_scores_in_regular_nms_keep_class_order_then_anchor_order():
    scores = [[0, 0.5, 0.5, 0.5], [0, 0.5, 0.9, 0.5], [0, 0.5, 0.5, 0.5], [0, 0.1, 0.1, 0.1], [0, 0.5, 0.5, 0.5]]
    model, inputs, options = one_box_per_anchor(APART, scores, max_detections=6, detections_per_class=3,
                                                use_regular_nms=True)
    kernel = check(model, inputs, options)
    assert kernel["classes"][0].tolist() == [1, 0, 0, 0, 1, 1]
    anchors_of = np.round((kernel["boxes"][0, :, 0] + 0.05 - 0.1) / 0.2).astype(int).tolist()
    assert anchors_of == [1, 0, 1, 2, 0, 2]  # 0.9 first; then class 0's three, then class 1's in anchor order


def test_equal_class_scores_in_fast_nms_report_the_lowest_class():
    scores = [[0.0] + [0.25, 0.75, 0.5, 0.75, 0.75, 0.25][:k] + [0.75] * (6 - k) for k in range(5)]
    model, inputs, options = one_box_per_anchor(APART, scores, max_detections=5)
    kernel = check(model, inputs, options)
    assert sorted(kernel["classes"][0].tolist()) == [0, 1, 1, 1, 1]


def test_ties_among_several_classes_per_detection_follow_libstdcxx_partial_sort():
    """std::partial_sort is a heap: equal scores do not keep their order, and the emulator follows it step by step."""
    rows = [[0.75, 0.5, 0.75], [0.75, 0.75, 0.25, 0.5, 0.75, 0.5], [0.25, 0.5, 0.75, 0.5, 0.5], [0.5] * 4]
    for values, k in zip(rows, [2, 3, 3, 4], strict=True):
        model, inputs, options = one_box_per_anchor([[0.5, 0.5, 0.2, 0.2]], [[0.0] + values],
                                                    max_detections=1, max_classes_per_detection=k)
        kernel = check(model, inputs, options)
        stable = np.argsort(-np.array(values), kind="stable")[:k]
        assert kernel["classes"][0].tolist() != stable.tolist()  # not a stable order
        assert kernel["classes"][0].tolist() == decreasing_partial_arg_sort(np.array([values], f32), k)[0].tolist()


def test_box_decoding_is_double_precision():
    """y / y_scale * anchor_h + anchor_y in double, rounded once: in float these give the neighbouring floats.
    (Encodings h = w = -100 make the half sizes vanish, so the corners are the centers.)"""
    anchors = [[0.3, 0.45, 0.7, 0.7], [0.2, 0.1, 0.9, 0.9]]
    encodings = np.array([[[7, -1.5, -100, -100], [-1.5, 7, -100, -100]]], f32)
    options = dict(num_classes=1, nms_iou_threshold=1.0, h_scale=1.0, w_scale=1.0)
    model = postprocess_alone(np.array(anchors, f32), 2, **options)
    kernel = check(model, [encodings, np.array([[[0, 0.9], [0, 0.8]]], f32)], options)
    centers = kernel["boxes"][0, :2, :2]
    assert (centers == kernel["boxes"][0, :2, 2:]).all()
    in_double = [[0.79, 0.345], [0.065000005, 0.72999996]]
    in_float = [[0.78999996, 0.34499997], [0.065, 0.73]]
    assert centers.tolist() == np.array(in_double, f32).tolist()
    assert not (centers == np.array(in_float, f32)).any()


# (h, anchor_h) pairs where libm's exp(h) and numpy's differ by a bit that survives rounding half_h to float:
# found by search (numpy's SIMD exp differs from glibc's in ~5% of doubles; the float rounding hides almost all).
EXP_CASES = [(0.9731934, 0.8481777), (0.16331075, 0.84939784), (0.9799963, 0.6991754), (1.301529, 0.8195006)]


def test_exp_memo_gives_libms_doubles():
    values = np.concatenate([np.random.default_rng(0).normal(0, 3, 500), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    memo: dict = {}
    first = libm.exp(values, memo)
    assert len(memo) == 505 - 1  # -0.0 and 0.0 are one value to np.unique
    assert libm.exp(values, memo).tobytes() == first.tobytes() == libm.exp(values).tobytes()


def test_box_decoding_calls_the_c_librarys_exp():
    h, anchor_h = (np.array(column, f32) for column in zip(*EXP_CASES, strict=True))
    anchors = np.zeros((len(h), 4), f32)
    anchors[:, 2] = anchors[:, 3] = anchor_h
    encodings = np.zeros((1, len(h), 4), f32)
    encodings[0, :, 2] = encodings[0, :, 3] = h
    options = dict(num_classes=1, max_detections=len(h), nms_iou_threshold=1.0, h_scale=1.0, w_scale=1.0)
    model = postprocess_alone(anchors, 2, **options)
    scores = np.zeros((1, len(h), 2), f32)
    scores[0, :, 1] = np.linspace(0.9, 0.6, len(h))
    kernel = check(model, [encodings, scores], options)
    exponent = h.astype(np.float64)
    differ = libm.exp(exponent) != np.exp(exponent)
    with_numpy = (0.5 * np.exp(exponent) * anchor_h.astype(np.float64)).astype(f32)
    # where this machine's libm and numpy disagree, the kernel's half height is libm's
    assert not (kernel["boxes"][0, :, 2] == with_numpy)[differ].any()


def test_uint8_class_predictions_dequantize_by_position():
    """The runtime's Dequantize takes 8 values at a time in float (scale, then -zero_point * scale added) and the
    last size % 8 in double: one byte can give two floats, depending on where it sits."""
    scale, zero_point = 0.0731, 37

    def vector(q):
        return f32(q) * f32(scale) + f32(-zero_point * np.float64(f32(scale)))

    def scalar(q):
        return f32(np.float64(f32(scale)) * (q - zero_point))

    byte = next(q for q in range(64, 256) if vector(q) != scalar(q))
    tables = [vector(byte), scalar(byte)]
    assert tables[0] != tables[1]
    n = 3  # 3 anchors x 3 columns = 9 values: the first 8 in the vector path, the last one in the tail
    predictions = np.zeros((1, n, 3), np.uint8)
    predictions[0, 0, 1] = predictions[0, 2, 2] = byte  # flat positions 1 and 8
    options = dict(num_classes=2, max_detections=n, max_classes_per_detection=2, nms_iou_threshold=1.0)
    model = postprocess_alone(np.array(APART[:n], f32), 3, predictions="UINT8", predictions_q=(scale, zero_point),
                              **options)
    kernel = check(model, [np.zeros((1, n, 4), f32), predictions], options)
    assert set(kernel["scores"][0].tolist()) >= {float(tables[0]), float(tables[1])}


@pytest.mark.parametrize("background", [True, False])
def test_a_background_column_is_left_out_and_classes_count_from_zero(background):
    scores = [[0.0, 0.7], [0.0, 0.6]] if not background else [[0.9, 0.0, 0.7], [0.9, 0.6, 0.0]]
    for regular in (False, True):
        model, inputs, options = one_box_per_anchor(APART[:2], scores, num_classes=2, use_regular_nms=regular,
                                                    max_detections=2)
        kernel = check(model, inputs, options)
        assert kernel["classes"][0].tolist() == ([1, 0] if background else [1, 1])


def test_boxes_are_not_clipped_to_the_image():
    anchors = [[0.05, 0.95, 0.3, 0.3], [0.5, 0.5, 1.5, 1.5]]
    model, inputs, options = one_box_per_anchor(anchors, [[0, 0.9], [0, 0.8]], nms_iou_threshold=1.0)
    kernel = check(model, inputs, options)
    assert kernel["boxes"][0, 0].tolist() == pytest.approx([-0.1, 0.8, 0.2, 1.1])
    assert kernel["boxes"][0, 1].tolist() == pytest.approx([-0.25, -0.25, 1.25, 1.25])


def test_a_score_equal_to_the_threshold_is_kept():
    threshold = 0.25
    scores = [[0, threshold], [0, float(np.nextafter(f32(threshold), f32(0)))], [0, 0.5]]
    for regular in (False, True):
        model, inputs, options = one_box_per_anchor(APART[:3], scores, nms_score_threshold=threshold,
                                                    use_regular_nms=regular)
        assert check(model, inputs, options)["count"][0] == 2


def test_an_overlap_equal_to_the_threshold_keeps_the_box():
    """Boxes [0, 0, 1, 1] and [0, 0.5, 1, 1.5]: IoU 0.5 / 1.5, exactly float(1/3); suppressed only above it."""
    anchors = [[0.5, 0.5, 1, 1], [0.5, 1.0, 1, 1]]
    third = float(f32(1 / 3))
    for regular in (False, True):
        for iou_threshold, count in ((third, 2), (float(np.nextafter(f32(third), f32(0))), 1)):
            model, inputs, options = one_box_per_anchor(anchors, [[0, 0.9], [0, 0.8]], nms_iou_threshold=iou_threshold,
                                                        use_regular_nms=regular)
            assert check(model, inputs, options)["count"][0] == count


def test_quantized_anchors_and_float_anchors_read_as_bytes():
    """uint8 box encodings take the anchor tensor's bytes as uint8 with its own scale and zero point: uint8 anchors
    dequantize; float32 anchors (scale 0) become zeros, and every box collapses to a point."""
    anchors = (grid_anchors(2) * 200).astype(np.uint8) + 3
    encodings = np.random.default_rng(0).integers(120, 136, (1, 4, 4)).astype(np.uint8)
    scores = np.array([[[0, 0.9], [0, 0.8], [0, 0.7], [0, 0.6]]], f32)
    options = dict(num_classes=1, max_detections=4)
    for anchor_values, q in ((anchors, (1 / 200, 3)), (grid_anchors(2), (1 / 200, 3))):
        model = postprocess_alone(anchor_values, 2, encodings="UINT8", encodings_q=(0.05, 128), anchors_q=q, **options)
        kernel = check(model, [encodings, scores], options)
        assert kernel["count"][0] == 4  # four points (area 0: IoU 0) or four boxes apart
        assert kernel["boxes"].any() == (anchor_values.dtype == np.uint8)


def test_rows_past_the_detections():
    """Regular NMS writes zeros up to max_detections; fast NMS writes only the detections' rows, so the runtime's
    other rows keep whatever was there, here the previous invoke's boxes. Read `count` rows, never more."""
    options = dict(num_classes=1, max_detections=4, nms_iou_threshold=1.0)
    model = postprocess_alone(np.array(APART[:4], f32), 2, **options)
    encodings = np.zeros((1, 4, 4), f32)
    many, few = (np.array([[[0, s] for s in scores]], f32) for scores in ([0.9, 0.8, 0.7, 0.6], [0.9, 0.0, 0.0, 0.0]))
    real = RealInterpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    real.allocate_tensors()
    emulator = Interpreter(model_content=model)
    emulator.allocate_tensors()
    results = []
    for interpreter in (real, emulator):
        for scores in (many, few):
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], encodings)
            interpreter.set_tensor(interpreter.get_input_details()[1]["index"], scores)
            interpreter.invoke()
        results.append([interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()])
    (real_boxes, _, _, real_count), (boxes, _, _, count) = results
    assert real_count[0] == count[0] == 1
    assert real_boxes[0, 1:].tolist() == [apart_box(i) for i in (1, 2, 3)]  # stale
    assert not boxes[0, 1:].any()
    regular = dict(options, use_regular_nms=True)
    model = postprocess_alone(np.array(APART[:4], f32), 2, **regular)
    kernel = check(model, [encodings, few], regular)
    assert not kernel["boxes"][0, 1:].any() and not kernel["scores"][0, 1:].any()


def apart_box(i: int) -> list[float]:
    """Anchor i of APART as the corners the kernel decodes from a zero encoding."""
    y, x, h, w = (f32(v) for v in APART[i])
    return [float(y - f32(0.5) * h), float(x - f32(0.5) * w), float(y + f32(0.5) * h), float(x + f32(0.5) * w)]


def test_more_classes_per_detection_than_classes():
    """max_classes_per_detection 4 with 2 classes: each detection's group has 4 rows, the kernel writes 2."""
    scores = [[0, 0.9, 0.3], [0, 0.2, 0.8]]
    for regular in (False, True):
        model, inputs, options = one_box_per_anchor(APART[:2], scores, max_detections=2, max_classes_per_detection=4,
                                                    use_regular_nms=regular)
        kernel = check(model, inputs, options)
        assert kernel["boxes"].shape == (1, 8, 4)


def test_box_encodings_with_keypoints():
    """Encodings [1, N, 4 + keypoints]: the first 4 are the box."""
    options = dict(num_classes=1, max_detections=3)
    model = postprocess_alone(np.array(APART[:3], f32), 2, code_size=10, **options)
    encodings = np.random.default_rng(1).normal(0, 1, (1, 3, 10)).astype(f32)
    check(model, [encodings, np.array([[[0, 0.9], [0, 0.8], [0, 0.7]]], f32)], options)


def test_outputs_declared_without_a_shape_take_the_kernels():
    """TF 2.21's converter writes the op's outputs with no shape: TFLite gives them [1, M, 4], [1, M], [1, M], [1]
    at allocate_tensors, and so does the emulator, from the start."""
    options = dict(num_classes=1, max_detections=3, max_classes_per_detection=2)
    model = postprocess_alone(np.array(APART[:3], f32), 2, output_shapes=False, **options)
    real = RealInterpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    assert [d["shape"].tolist() for d in real.get_output_details()] == [[]] * 4
    real.allocate_tensors()
    emulator = Interpreter(model_content=model)
    for ours, theirs in zip(emulator.get_output_details(), real.get_output_details(), strict=True):
        assert ours["shape"].tolist() == theirs["shape"].tolist() and ours["name"] == theirs["name"]
        assert ours["shape_signature"].tolist() == theirs["shape_signature"].tolist()
    assert [d["shape"].tolist() for d in emulator.get_output_details()] == [[1, 6, 4], [1, 6], [1, 6], [1]]
    check(model, [np.zeros((1, 3, 4), f32), np.array([[[0, 0.9], [0, 0.2], [0, 0.7]]], f32)], options)


# ---- every option ----

OPTION_VALUES = {
    "max_detections": (1, 3),
    "max_classes_per_detection": (1, 2),
    "detections_per_class": (1, 3),
    "use_regular_nms": (False, True),
    "nms_score_threshold": (0.3, 0.85),
    "nms_iou_threshold": (0.1, 0.7),
    "num_classes": (2, 3),
    "y_scale": (10.0, 2.0),
    "x_scale": (10.0, 2.0),
    "h_scale": (5.0, 1.5),
    "w_scale": (5.0, 1.5),
}


@pytest.mark.parametrize("option", sorted(OPTION_VALUES))
def test_each_option_changes_the_output_and_matches(option):
    """Six overlapping boxes, three classes and the background (seed 10: one where each option's two values give
    different outputs, which the test asserts)."""
    rng = np.random.default_rng(10)
    anchors = np.array([[0.5, 0.3 + 0.08 * i, 0.4, 0.3] for i in range(6)], f32)
    encodings = rng.normal(0, 1, (1, 6, 4)).astype(f32)
    scores = rng.random((1, 6, 4)).astype(f32)
    base = dict(max_detections=3, max_classes_per_detection=1, detections_per_class=2, use_regular_nms=True,
                nms_score_threshold=0.3, nms_iou_threshold=0.4, num_classes=3)
    if option == "max_classes_per_detection":
        base["use_regular_nms"] = False
    outputs = []
    for value in OPTION_VALUES[option]:
        options = {**base, option: value}
        columns = 4 if options["num_classes"] == 3 else 3
        model = postprocess_alone(anchors, columns, **options)
        kernel = check(model, [encodings, scores[:, :, :columns]], options)
        outputs.append(b"".join(kernel[role].tobytes() for role in OUTPUT_ROLES))
    assert outputs[0] != outputs[1]


def flexbuffer_options(values: dict) -> bytes:
    builder = flexbuffers.Builder()
    with builder.Map():
        for key, value in values.items():
            {bool: builder.Bool, int: builder.Int, float: builder.Float}[type(value)](key, value)
    return bytes(builder.Finish())


def test_missing_options_take_the_kernels_defaults():
    """No detections_per_class: 100; no use_regular_nms: fast NMS."""
    options = {k: v for k, v in DEFAULT_OPTIONS.items() if k not in ("detections_per_class", "use_regular_nms")}
    model = postprocess_alone(np.array(APART[:3], f32), 3, options_bytes=flexbuffer_options(options))
    scores = np.array([[[0, 0.5, 0.6], [0, 0.7, 0.1], [0, 0.2, 0.3]]], f32)
    kernel = check(model, [np.zeros((1, 3, 4), f32), scores], dict(options, use_regular_nms=False))
    assert kernel["count"][0] == 3


def test_options_stored_as_other_types_convert_as_flexbuffers_does():
    """Ints written as floats are truncated, a bool written as an int is true when not 0, floats written as ints."""
    stored = dict(DEFAULT_OPTIONS, max_detections=4.9, max_classes_per_detection=2.0, use_regular_nms=1,
                  nms_iou_threshold=1, y_scale=10, num_classes=2.0)
    read = dict(DEFAULT_OPTIONS, max_detections=4, max_classes_per_detection=2, use_regular_nms=True, num_classes=2)
    model = postprocess_alone(np.array(APART, f32), 3, options_bytes=flexbuffer_options(stored), **read)
    scores = np.array([[[0, 0.5, 0.6], [0, 0.7, 0.1], [0, 0.2, 0.3], [0, 0.9, 0.9], [0, 0.4, 0.45]]], f32)
    kernel = check(model, [np.zeros((1, 5, 4), f32), scores], read)
    assert kernel["count"][0] == 4


# ---- what the kernel refuses ----

A4 = grid_anchors(2)
F_ENC, F_SCORES = np.zeros((1, 4, 4), f32), np.full((1, 4, 2), 0.5, f32)
REFUSED = {
    "int8 box encodings": (dict(encodings="INT8", encodings_q=(0.05, 0)), [np.zeros((1, 4, 4), np.int8), F_SCORES],
                           "box encodings are INT8"),
    "int8 class predictions": (dict(predictions="INT8", predictions_q=(1 / 256, -128)),
                               [F_ENC, np.zeros((1, 4, 2), np.int8)], "class predictions are INT8"),
    "quantized anchors with float encodings": (dict(anchors=(A4 * 256).astype(np.uint8)), [F_ENC, F_SCORES],
                                               "needs FLOAT32 anchors"),
    "IoU threshold 0": (dict(nms_iou_threshold=0.0), [F_ENC, F_SCORES], "0 < threshold <= 1"),
    "IoU threshold above 1": (dict(nms_iou_threshold=1.5), [F_ENC, F_SCORES], "0 < threshold <= 1"),
    "two extra columns": (dict(columns=4), [F_ENC, np.zeros((1, 4, 4), f32)], "one more for the background"),
    "regular NMS with detections_per_class 0": (dict(use_regular_nms=True, detections_per_class=0),
                                                [F_ENC, F_SCORES], "regular NMS needs"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_kernel_refuses_fails_at_load(case):
    changes, inputs, message = REFUSED[case]
    changes = dict(changes)
    anchors, columns = changes.pop("anchors", A4), changes.pop("columns", 2)
    model = postprocess_alone(anchors, columns, **{"num_classes": 1, **changes})
    with pytest.raises(RuntimeError, match="failed to invoke"):
        run_kernel(model, inputs)
    with pytest.raises(UnsupportedOperators, match=message):
        Interpreter(model_content=model)


def test_an_inverted_box_fails_at_invoke_like_the_kernel():
    anchors = A4.copy()
    anchors[2, 2] = -0.5  # a negative height: ymin > ymax
    model = postprocess_alone(anchors, 2, num_classes=1)
    with pytest.raises(RuntimeError, match="ValidateBoxes"):
        run_kernel(model, [F_ENC, F_SCORES])
    with pytest.raises(InvokeFailed, match="ymin > ymax"):
        run_emulator(model, [F_ENC, F_SCORES])


def test_the_runtime_with_several_threads_skips_a_class_in_regular_nms():
    """A fact about the pinned runtime, not the emulator (which is its one-thread kernel): with num_threads=2 its
    regular NMS never looks at class 2 (a worker's next class is ++next_col, which starts at num_threads). With
    detections_per_class < max_detections the same path also writes past a buffer. Run detectors on one thread."""
    scores = [[0, 0.1, 0.2, 0.9, 0.3]] + [[0, 0.1, 0.1, 0.1, 0.1]] * 2
    model, inputs, options = one_box_per_anchor(APART[:3], scores, use_regular_nms=True, max_detections=3,
                                                detections_per_class=3)
    one_thread = check(model, inputs, options)
    assert one_thread["classes"][0, 0] == 2
    two_threads = by_role(run_kernel(model, inputs, num_threads=2))
    assert 2 not in two_threads["classes"][0, :int(two_threads["count"][0])].tolist()


def test_the_benchmark_runs_and_finds_the_same_detections():
    """bench/detection_postprocess_bench.py, two rounds: it exits 0 only when the emulator's detections equal the
    kernel's in every configuration (its timings are not judged here)."""
    bench = ROOT / "bench" / "detection_postprocess_bench.py"
    done = subprocess.run([sys.executable, str(bench), "-n", "2", "--warmup", "0"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" True") == 3 and "regular NMS, 100 detections" in done.stdout


def test_the_cpu_engine_runs_a_regular_nms_detector_on_one_thread(tmp_path):
    """The runtime fact above, applied: the `cpu` engine asked for 2 threads runs a regular-NMS detector on one
    (app/engines/litert.py interpreter_threads), so it answers as the one-thread kernel; a fast-NMS detector and
    a classifier keep the threads asked for."""
    from app.engines.cpu import CpuEngine
    from app.engines.base import EngineOptions
    from app.engines.litert import interpreter_threads

    scores = [[0, 0.1, 0.2, 0.9, 0.3]] + [[0, 0.1, 0.1, 0.1, 0.1]] * 2
    model, inputs, options = one_box_per_anchor(APART[:3], scores, use_regular_nms=True, max_detections=3,
                                                detections_per_class=3)
    path = tmp_path / "regular.tflite"
    path.write_bytes(model)
    assert interpreter_threads(path, 2) == 1
    engine = CpuEngine.load(path, EngineOptions(cpu_threads=2))
    served = by_role(engine.run(inputs))
    assert served["classes"][0, 0] == 2 and (served["boxes"] == by_role(run_kernel(model, inputs))["boxes"]).all()
    fast = tmp_path / "fast.tflite"
    fast.write_bytes(tiny_detector())
    assert interpreter_threads(fast, 2) == 2
    plain = tmp_path / "plain.tflite"
    plain.write_bytes(postprocess_alone(np.asarray(APART[:3], f32), 5, num_classes=4).replace(
        b"TFLite_Detection_PostProcess", b"TFLite_Detection_Xostprocess"))
    assert interpreter_threads(plain, 2) == 2



def test_options_the_reader_cannot_take_as_numbers_keep_a_detector_on_one_thread(tmp_path):
    """use_regular_nms stored as text (the kernel would parse it): interpreter_threads cannot tell, and one thread
    answers right in either mode."""
    from app.engines.litert import interpreter_threads

    builder = flexbuffers.Builder()
    with builder.Map():
        for key, value in DEFAULT_OPTIONS.items():
            if key == "use_regular_nms":
                builder.String(key, "1")
            else:
                {bool: builder.Bool, int: builder.Int, float: builder.Float}[type(value)](key, value)
    path = tmp_path / "text.tflite"
    path.write_bytes(postprocess_alone(np.asarray(APART[:3], f32), 3, options_bytes=bytes(builder.Finish())))
    assert interpreter_threads(path, 2) == 1
