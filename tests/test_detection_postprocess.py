"""app/detection_postprocess.py: the post-process op found in a graph, its outputs by role, its options as its kernel
reads them (the kernel's own behaviour on each is checked against the runtime in tests/test_emulator_detection.py)."""

import dataclasses

import numpy as np
import pytest

from app.detection_postprocess import (
    DEFAULT_DETECTIONS_PER_CLASS,
    OUTPUT_ROLES,
    POSTPROCESS_OP,
    PostProcessError,
    PostProcessOptions,
    find_postprocess_op,
    outputs_by_role,
    postprocess_ops,
    read_options,
)
from app.tflite_file import TfliteFileError, read_tflite
from tests.detection_models import DEFAULT_OPTIONS, OUTPUT_ORDERS, output_names, postprocess_alone, tiny_detector
from tests.tflite_builder import conv_chain


@pytest.mark.parametrize("order", sorted(OUTPUT_ORDERS))
def test_the_outputs_are_found_by_role_on_the_op_whatever_the_graphs_order(order):
    graph = read_tflite(tiny_detector(order=order)).graph
    by_role = outputs_by_role(graph)
    assert list(by_role) == list(OUTPUT_ROLES) == ["boxes", "classes", "scores", "count"]
    assert {role: tensor.name for role, tensor in by_role.items()} == output_names(order)
    assert [graph.tensors[i].name for i in graph.outputs] == [by_role[role].name for role in OUTPUT_ORDERS[order]]


def test_a_classifier_has_no_post_process_op():
    graph = read_tflite(conv_chain()).graph
    assert postprocess_ops(graph) == []
    with pytest.raises(PostProcessError, match=f"expected one {POSTPROCESS_OP} op, found 0"):
        find_postprocess_op(graph)
    with pytest.raises(ValueError):  # the converter's callers take it as a ValueError, the service as a bad file
        outputs_by_role(graph)


def test_an_op_without_its_four_outputs_is_refused():
    graph = read_tflite(tiny_detector()).graph
    op = dataclasses.replace(find_postprocess_op(graph), outputs=find_postprocess_op(graph).outputs[:3])
    with pytest.raises(TfliteFileError, match=f"{POSTPROCESS_OP} has 3 outputs, expected 4"):
        outputs_by_role(graph, op)


def test_options_are_read_as_the_kernel_reads_them():
    anchors = np.zeros((2, 4), np.float32)
    op = find_postprocess_op(read_tflite(postprocess_alone(anchors, 3, max_detections=7, nms_iou_threshold=0.6)).graph)
    options = read_options(op)
    assert (options.max_detections, options.num_classes, options.detections_per_class) == (7, 2, 100)
    assert options.intersection_over_union_threshold == np.float32(0.6)
    assert options.scale_values == (10.0, 10.0, 5.0, 5.0) and options.num_detected_boxes == 7


def test_missing_options_take_the_kernels_defaults_and_others_read_zero():
    left_out = postprocess_alone(np.zeros((2, 4), np.float32), 3, detections_per_class=None, use_regular_nms=None,
                                 y_scale=None)
    options = read_options(find_postprocess_op(read_tflite(left_out).graph))
    assert options.detections_per_class == DEFAULT_DETECTIONS_PER_CLASS == 100
    assert options.use_regular_non_max_suppression is False
    assert options.scale_values[0] == 0.0


def test_stored_types_convert_as_flexbuffers_does_and_what_is_no_number_is_refused():
    read = PostProcessOptions.read(dict(DEFAULT_OPTIONS, max_detections=4.9, use_regular_nms=1, num_classes=2**32 + 3))
    assert (read.max_detections, read.use_regular_non_max_suppression, read.num_classes) == (4, True, 3)
    assert PostProcessOptions.read(dict(DEFAULT_OPTIONS, use_regular_nms=0.5)).use_regular_non_max_suppression is False
    with pytest.raises(PostProcessError, match="option value 'ten' is not a number"):
        PostProcessOptions.read(dict(DEFAULT_OPTIONS, y_scale="ten"))


def test_options_that_are_no_flexbuffer_map_are_a_bad_file():
    graph = read_tflite(postprocess_alone(np.zeros((2, 4), np.float32), 3, options_bytes=b"\x01\x02\x03")).graph
    with pytest.raises(TfliteFileError, match="custom options"):
        read_options(find_postprocess_op(graph))
