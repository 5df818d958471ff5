"""The tiny detectors the detection tests share run in TFLite's own interpreter and find the square."""

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from tests.detection_models import OUTPUT_ORDERS, square_image, tiny_detector


@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
@pytest.mark.parametrize("order", sorted(OUTPUT_ORDERS))
def test_tiny_detector_boxes_the_white_square_in_every_output_order(order, feed):
    interpreter = Interpreter(model_content=tiny_detector(order=order, feed=feed),
                              experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], square_image(16, 4, 8, 8)[None])
    interpreter.invoke()
    by_role = {role: interpreter.get_tensor(detail["index"])
               for role, detail in zip(OUTPUT_ORDERS[order], interpreter.get_output_details())}
    count = int(by_role["count"][0])
    assert count == 4  # the square covers 2 x 2 cells of the 4 x 4 grid
    boxes = by_role["boxes"][0, :count]
    assert (boxes.min(axis=0)[:2] == [0.25, 0.5]).all() and (boxes.max(axis=0)[2:] == [0.75, 1.0]).all()
    assert (by_role["classes"][0, :count] == 0).all() and (by_role["scores"][0, :count] > 0.9).all()
