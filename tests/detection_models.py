"""Tiny SSD-style detectors built as flatbuffers: a quantized head ending in TFLite_Detection_PostProcess.

Small enough to build in milliseconds and to run on every backend, shaped like what the common
exporters write (Coral's model zoo, Model Maker, the TF object-detection API):

    uint8 image [1, S, S, 3] -> QUANTIZE -> CONV_2D (boxes) -> RESHAPE [1, N, 4] ------------+
                             \\-> CONV_2D (classes) -> RESHAPE [1, N, C+1] -> LOGISTIC --------+-> TFLite_Detection_PostProcess
                                                               anchors: a float32 [N, 4] constant -+      -> boxes [1, M, 4], classes [1, M],
                                                                                                            scores [1, M], count [1]

N = (S / 4)^2 anchors: the image is seen through a 4x4 stride-4 convolution, one anchor per cell.
The weights are chosen, not random, so that bright regions score high for class 0 and the box
encodings stay near zero (boxes near their anchors): a white square on black gives a box where the
square is. `OUTPUT_ORDERS` lists the subgraph output orders the exporters produce; the post-process
op's own outputs are always boxes, classes, scores, count.

    model_bytes = tiny_detector(order="tf2")
"""

from __future__ import annotations

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from tests.tflite_builder import GraphBuilder

POSTPROCESS = "TFLite_Detection_PostProcess"
ROLES = ("boxes", "classes", "scores", "count")  # the op's outputs, in its order
# subgraph output order, by exporter: TF1 object-detection export, and TF2 / Model Maker exports
OUTPUT_ORDERS = {
    "tf1": ("boxes", "classes", "scores", "count"),
    "tf2": ("scores", "boxes", "count", "classes"),
}
DEFAULT_OPTIONS = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100,
                       use_regular_nms=False, nms_score_threshold=0.3, nms_iou_threshold=0.5,
                       num_classes=2, y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0)


def postprocess_options(**options) -> bytes:
    """The op's custom options: a flexbuffer map, as the converter writes it."""
    values = {**DEFAULT_OPTIONS, **options}
    builder = flexbuffers.Builder()
    with builder.Map():
        for key, value in values.items():
            if isinstance(value, bool):
                builder.Bool(key, value)
            elif isinstance(value, int):
                builder.Int(key, value)
            else:
                builder.Float(key, float(value))
    return bytes(builder.Finish())


def grid_anchors(cells: int) -> np.ndarray:
    """One anchor per cell of a cells x cells grid, center-size (ycenter, xcenter, h, w), normalized."""
    centers = (np.arange(cells) + 0.5) / cells
    y, x = np.meshgrid(centers, centers, indexing="ij")
    size = np.full(cells * cells, 1.0 / cells)
    return np.stack([y.ravel(), x.ravel(), size, size], axis=1).astype(np.float32)


def tiny_detector(size: int = 16, order: str = "tf1", feed: str = "dequantize", **options) -> bytes:
    """A detector of `size` x `size` uint8 images with DEFAULT_OPTIONS (or these) on its post-process op.

    feed: how the quantized head reaches the op: "dequantize" (float32 through DEQUANTIZE, as TF2's
    converter writes full-int8 models) or "uint8" (uint8 tensors, as TF1 quantized models have)."""
    options = {**DEFAULT_OPTIONS, **options}
    classes = options["num_classes"]
    cells = size // 4
    n = cells * cells
    g = GraphBuilder()
    image = g.tensor("image", [1, size, size, 3], "UINT8", scale=1 / 255, zero_point=0)
    x = g.tensor("normalized", [1, size, size, 3], "INT8", scale=1 / 255, zero_point=-128)
    g.op("QUANTIZE", [image], [x])

    # boxes: weights 0, so every encoding is 0 plus a small bias: each box sits on its anchor
    wb = g.tensor("boxes/weights", [4, 4, 4, 3], "INT8", scale=[0.01] * 4, zero_point=[0] * 4,
                  data=np.zeros((4, 4, 4, 3)))
    bb = g.tensor("boxes/bias", [4], "INT32", scale=[0.01 / 255] * 4, zero_point=[0] * 4, data=np.zeros(4))
    enc = g.tensor("boxes/conv", [1, cells, cells, 4], "INT8", scale=0.05, zero_point=0)
    g.op("CONV_2D", [x, wb, bb], [enc], padding="VALID", strideW=4, strideH=4, dilationWFactor=1,
         dilationHFactor=1)
    shape4 = g.constant("boxes/shape", [1, n, 4])
    encodings = g.tensor("box_encodings", [1, n, 4], "INT8", scale=0.05, zero_point=0)
    g.op("RESHAPE", [enc, shape4], [encodings], newShape=[1, n, 4])

    # classes: class 0 (background) falls with brightness, class 1 rises, class k >= 2 stays low
    weights = np.zeros((classes + 1, 4, 4, 3))
    weights[0], weights[1] = -50, 50  # real 1.0 per tap: the logit is the cell's summed brightness (0..48)
    per_unit = 255 / 0.02  # bias quantization: real = q * input scale * weight scale
    bias = np.zeros(classes + 1)
    bias[1] = -24 * per_unit   # class 1: -24 (dark) .. +24 (white)
    bias[2:] = -10 * per_unit  # other classes: never
    wc = g.tensor("classes/weights", weights.shape, "INT8", scale=[0.02] * (classes + 1),
                  zero_point=[0] * (classes + 1), data=weights)
    bc = g.tensor("classes/bias", [classes + 1], "INT32", scale=[0.02 / 255] * (classes + 1),
                  zero_point=[0] * (classes + 1), data=np.round(bias))
    logits = g.tensor("classes/conv", [1, cells, cells, classes + 1], "INT8", scale=0.1, zero_point=0)
    g.op("CONV_2D", [x, wc, bc], [logits], padding="VALID", strideW=4, strideH=4, dilationWFactor=1,
         dilationHFactor=1)
    shape_c = g.constant("classes/shape", [1, n, classes + 1])
    flat = g.tensor("class_logits", [1, n, classes + 1], "INT8", scale=0.1, zero_point=0)
    g.op("RESHAPE", [logits, shape_c], [flat], newShape=[1, n, classes + 1])
    predictions = g.tensor("class_predictions", [1, n, classes + 1], "INT8", scale=1 / 256, zero_point=-128)
    g.op("LOGISTIC", [flat], [predictions])

    encodings, predictions = (_feed(g, encodings, feed), _feed(g, predictions, feed))
    if feed == "uint8":  # quantized anchors too, as TF1's quantized exports have them (scale 1/256: exact here)
        anchors = g.tensor("anchors", [n, 4], "UINT8", scale=1 / 256, zero_point=0,
                           data=np.round(grid_anchors(cells) * 256))
    else:
        anchors = g.tensor("anchors", [n, 4], "FLOAT32", data=grid_anchors(cells))
    m = options["max_detections"] * options["max_classes_per_detection"]
    outs = {
        "boxes": g.tensor(POSTPROCESS, [1, m, 4], "FLOAT32"),
        "classes": g.tensor(f"{POSTPROCESS}:1", [1, m], "FLOAT32"),
        "scores": g.tensor(f"{POSTPROCESS}:2", [1, m], "FLOAT32"),
        "count": g.tensor(f"{POSTPROCESS}:3", [1], "FLOAT32"),
    }
    g.op("CUSTOM", [encodings, predictions, anchors], [outs[r] for r in ROLES], custom_code=POSTPROCESS)
    op = g.operators[-1]
    op.customOptions = list(postprocess_options(**options))
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    return g.build([image], [outs[r] for r in OUTPUT_ORDERS[order]])


def _feed(g: GraphBuilder, tensor: int, feed: str) -> int:
    source = g.tensors[tensor]
    scale, zero_point = source.quantization.scale[0], source.quantization.zeroPoint[0]
    if feed == "dequantize":
        out = g.tensor(f"{source.name.decode() if isinstance(source.name, bytes) else source.name}/dequantized",
                       source.shape, "FLOAT32")
        g.op("DEQUANTIZE", [tensor], [out])
    elif feed == "uint8":
        out = g.tensor(f"{source.name.decode() if isinstance(source.name, bytes) else source.name}/uint8",
                       source.shape, "UINT8", scale=scale, zero_point=zero_point + 128)
        g.op("QUANTIZE", [tensor], [out])
    else:
        raise ValueError(f"feed is 'dequantize' or 'uint8', not {feed!r}")
    return out


def output_names(order: str = "tf1") -> dict[str, str]:
    """model.json's `outputs` for tiny_detector(order=...): role -> tensor name (the same for every order)."""
    return {role: POSTPROCESS if i == 0 else f"{POSTPROCESS}:{i}" for i, role in enumerate(ROLES)}


def square_image(size: int, top: int, left: int, side: int) -> np.ndarray:
    """Black, with a white square: what tiny_detector finds."""
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[top:top + side, left:left + side] = 255
    return pixels
