"""converter.detection: a detector's operators, its outputs by role, and int8 against float box for box."""

import numpy as np
import pytest

from converter import detection
from app.detection_postprocess import POSTPROCESS_OP
from tests.detection_models import OUTPUT_ORDERS, output_names, tiny_detector


@pytest.mark.parametrize("order", sorted(OUTPUT_ORDERS))
def test_the_outputs_are_named_by_the_ops_own_outputs_whatever_the_subgraphs_order(order):
    assert detection.postprocess_outputs(tiny_detector(order=order)) == output_names(order)


@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
def test_a_detector_is_described_by_its_operators_and_its_integer_input(feed):
    report = detection.describe(tiny_detector(feed=feed))
    feeds = {"dequantize": {"QUANTIZE": 1, "DEQUANTIZE": 2}, "uint8": {"QUANTIZE": 3}}[feed]  # + the image's QUANTIZE
    assert report["operators"] == {"CONV_2D": 2, "LOGISTIC": 1, "RESHAPE": 2, POSTPROCESS_OP: 1, **feeds}
    assert report["input"] == {"dtype": "uint8", "shape": [1, 16, 16, 3], "scale": pytest.approx(1 / 255),
                               "zero_point": 0}


def test_a_classifier_is_not_a_detector():
    from tests.tflite_builder import conv_chain

    with pytest.raises(ValueError, match=f"expected one {POSTPROCESS_OP} op, found 0"):
        detection.describe(conv_chain())


def test_the_int8_model_is_compared_with_the_float_one_box_for_box():
    """converter.detection's matching: one to one, same class, best IoU first, over the score threshold only."""
    float_ = detection.Detections(np.array([[0.1, 0.1, 0.5, 0.5], [0.5, 0.5, 0.9, 0.9], [0, 0, 0.2, 0.2]], np.float32),
                                  np.array([0, 0, 1]), np.array([0.9, 0.8, 0.7], np.float32))
    int8 = detection.Detections(np.array([[0.5, 0.5, 0.9, 0.95], [0.1, 0.1, 0.5, 0.5], [0, 0, 0.2, 0.2],
                                          [0.6, 0.0, 0.9, 0.2]], np.float32),
                                np.array([0, 0, 0, 0]), np.array([0.85, 0.88, 0.9, 0.6], np.float32))
    result = detection.compare([("a", None)], lambda _: float_, lambda _: int8, score_threshold=0.5, iou_threshold=0.5)
    # the class-1 box is not found (the int8 box there says class 0), the class-0 box there and the stray are extra
    assert (result.float_objects, result.found, result.int8_extra) == (3, 2, 2)
    assert result.per_photo == {"a": [1.0, round(0.16 / (0.16 + 0.02), 4)]}
    assert result.max_score_error == pytest.approx(0.05, abs=1e-4) and result.recall == pytest.approx(0.6667)
    assert detection.iou(np.array([-0.5, 0, 0.5, 1]), np.array([0, 0, 0.5, 1])) == 1.0  # clipped to the image first
