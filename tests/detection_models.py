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

For the op itself: `postprocess_alone` builds a graph of the op alone (any input types, quantization,
options, code size), `ssd_anchors` gives a 300x300 SSD MobileNet's 1917 anchors and `ssd_like_head`
the uint8 box encodings and class scores such a model hands the op on a photo with a few objects.
"""

from __future__ import annotations

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from app.detection_postprocess import OUTPUT_ROLES, POSTPROCESS_OP
from tests.tflite_builder import GraphBuilder

# subgraph output order, by exporter: TF1 object-detection export, and TF2 / Model Maker exports
OUTPUT_ORDERS = {
    "tf1": ("boxes", "classes", "scores", "count"),
    "tf2": ("scores", "boxes", "count", "classes"),
}
DEFAULT_OPTIONS = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100,
                       use_regular_nms=False, nms_score_threshold=0.3, nms_iou_threshold=0.5,
                       num_classes=2, y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0)


def postprocess_options(**options) -> bytes:
    """The op's custom options: a flexbuffer map, as the converter writes it (an option given as None is left out)."""
    values = {**DEFAULT_OPTIONS, **options}
    builder = flexbuffers.Builder()
    with builder.Map():
        for key, value in values.items():
            if value is None:
                continue
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


def tiny_detector(size: int = 16, order: str = "tf1", feed: str = "dequantize", scales: int = 1, **options) -> bytes:
    """A detector of `size` x `size` uint8 images with DEFAULT_OPTIONS (or these) on its post-process op.

    feed: how the quantized head reaches the op: "dequantize" (float32 through DEQUANTIZE, as TF2's
    converter writes full-int8 models) or "uint8" (uint8 tensors, as TF1 quantized models have).
    scales=2 adds a second, coarser grid (a stride-8 head, one anchor per 8x8 cell), its box encodings
    and class logits joined to the first's by CONCATENATION along the anchors, as SSD's feature maps are."""
    options = {**DEFAULT_OPTIONS, **options}
    classes = options["num_classes"]
    g = GraphBuilder()
    image = g.tensor("image", [1, size, size, 3], "UINT8", scale=1 / 255, zero_point=0)
    x = g.tensor("normalized", [1, size, size, 3], "INT8", scale=1 / 255, zero_point=-128)
    g.op("QUANTIZE", [image], [x])
    heads = [_head(g, x, size, 4, classes, "" if scales == 1 else "/0")]
    if scales == 2:
        heads.append(_head(g, x, size, 8, classes, "/1"))
    elif scales != 1:
        raise ValueError(f"scales is 1 or 2, not {scales!r}")
    cells = [size // stride for stride in (4, 8)[:scales]]
    n = sum(c * c for c in cells)
    if scales == 1:
        (encodings, flat), = heads
    else:
        encodings = g.tensor("box_encodings", [1, n, 4], "INT8", scale=0.05, zero_point=0)
        g.op("CONCATENATION", [h[0] for h in heads], [encodings], axis=1)
        flat = g.tensor("class_logits", [1, n, classes + 1], "INT8", scale=0.1, zero_point=0)
        g.op("CONCATENATION", [h[1] for h in heads], [flat], axis=1)
    predictions = g.tensor("class_predictions", [1, n, classes + 1], "INT8", scale=1 / 256, zero_point=-128)
    g.op("LOGISTIC", [flat], [predictions])

    grid = np.concatenate([grid_anchors(c) for c in cells])
    encodings, predictions = (_feed(g, encodings, feed), _feed(g, predictions, feed))
    if feed == "uint8":  # quantized anchors too, as TF1's quantized exports have them (scale 1/256: exact here)
        anchors = g.tensor("anchors", [n, 4], "UINT8", scale=1 / 256, zero_point=0, data=np.round(grid * 256))
    else:
        anchors = g.tensor("anchors", [n, 4], "FLOAT32", data=grid)
    m = options["max_detections"] * options["max_classes_per_detection"]
    outs = {
        "boxes": g.tensor(POSTPROCESS_OP, [1, m, 4], "FLOAT32"),
        "classes": g.tensor(f"{POSTPROCESS_OP}:1", [1, m], "FLOAT32"),
        "scores": g.tensor(f"{POSTPROCESS_OP}:2", [1, m], "FLOAT32"),
        "count": g.tensor(f"{POSTPROCESS_OP}:3", [1], "FLOAT32"),
    }
    g.op("CUSTOM", [encodings, predictions, anchors], [outs[r] for r in OUTPUT_ROLES], custom_code=POSTPROCESS_OP)
    op = g.operators[-1]
    op.customOptions = list(postprocess_options(**options))
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    return g.build([image], [outs[r] for r in OUTPUT_ORDERS[order]])


def _head(g: GraphBuilder, x: int, size: int, stride: int, classes: int, suffix: str) -> tuple[int, int]:
    """One grid's box encodings [1, n, 4] and class logits [1, n, classes + 1] (int8), n = (size / stride)^2."""
    cells = size // stride
    n = cells * cells
    # boxes: weights 0, so every encoding is 0 plus a small bias: each box sits on its anchor
    wb = g.tensor(f"boxes{suffix}/weights", [4, stride, stride, 3], "INT8", scale=[0.01] * 4, zero_point=[0] * 4,
                  data=np.zeros((4, stride, stride, 3)))
    bb = g.tensor(f"boxes{suffix}/bias", [4], "INT32", scale=[0.01 / 255] * 4, zero_point=[0] * 4, data=np.zeros(4))
    enc = g.tensor(f"boxes{suffix}/conv", [1, cells, cells, 4], "INT8", scale=0.05, zero_point=0)
    g.op("CONV_2D", [x, wb, bb], [enc], padding="VALID", strideW=stride, strideH=stride, dilationWFactor=1,
         dilationHFactor=1)
    shape4 = g.constant(f"boxes{suffix}/shape", [1, n, 4])
    encodings = g.tensor(f"box_encodings{suffix}", [1, n, 4], "INT8", scale=0.05, zero_point=0)
    g.op("RESHAPE", [enc, shape4], [encodings], newShape=[1, n, 4])

    # classes: class 0 (background) falls with brightness, class 1 rises, class k >= 2 stays low
    weight_scale = 0.02 * 16 / (stride * stride)  # real 48 / taps per tap: the logit is the cell's mean brightness * 48
    weights = np.zeros((classes + 1, stride, stride, 3))
    weights[0], weights[1] = -50, 50
    per_unit = 255 / weight_scale  # bias quantization: real = q * input scale * weight scale
    bias = np.zeros(classes + 1)
    bias[1] = -24 * per_unit   # class 1: -24 (dark) .. +24 (white)
    bias[2:] = -10 * per_unit  # other classes: never
    wc = g.tensor(f"classes{suffix}/weights", weights.shape, "INT8", scale=[weight_scale] * (classes + 1),
                  zero_point=[0] * (classes + 1), data=weights)
    bc = g.tensor(f"classes{suffix}/bias", [classes + 1], "INT32", scale=[weight_scale / 255] * (classes + 1),
                  zero_point=[0] * (classes + 1), data=np.round(bias))
    logits = g.tensor(f"classes{suffix}/conv", [1, cells, cells, classes + 1], "INT8", scale=0.1, zero_point=0)
    g.op("CONV_2D", [x, wc, bc], [logits], padding="VALID", strideW=stride, strideH=stride, dilationWFactor=1,
         dilationHFactor=1)
    shape_c = g.constant(f"classes{suffix}/shape", [1, n, classes + 1])
    flat = g.tensor(f"class_logits{suffix}", [1, n, classes + 1], "INT8", scale=0.1, zero_point=0)
    g.op("RESHAPE", [logits, shape_c], [flat], newShape=[1, n, classes + 1])
    return encodings, flat


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
    return {role: POSTPROCESS_OP if i == 0 else f"{POSTPROCESS_OP}:{i}" for i, role in enumerate(OUTPUT_ROLES)}


def square_image(size: int, top: int, left: int, side: int) -> np.ndarray:
    """Black, with a white square: what tiny_detector finds."""
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[top:top + side, left:left + side] = 255
    return pixels


def postprocess_alone(anchors: np.ndarray, columns: int, *, encodings: str = "FLOAT32", predictions: str = "FLOAT32",
                      code_size: int = 4, encodings_q: tuple[float, int] = (0.05, 128),
                      predictions_q: tuple[float, int] = (1 / 256, 0), anchors_q: tuple[float, int] = (1 / 256, 0),
                      order: str = "tf1", options_bytes: bytes | None = None, output_shapes: bool = True,
                      **options) -> bytes:
    """A graph of TFLite_Detection_PostProcess alone: box encodings [1, N, code_size] and class predictions
    [1, N, columns] are its inputs, `anchors` [N, 4] a constant (uint8 anchors are stored as given, with
    anchors_q). Types are "FLOAT32", "UINT8" or "INT8" (the last two with their (scale, zero point)).
    options_bytes replaces the flexbuffer options (DEFAULT_OPTIONS overridden by `options`) entirely.
    output_shapes=False declares the outputs without a shape, as TF 2.21's converter writes them."""
    options = {**DEFAULT_OPTIONS, **options}
    n = anchors.shape[0]
    g = GraphBuilder()

    def tensor(name, shape, type_name, q, data=None):
        if type_name == "FLOAT32":
            return g.tensor(name, shape, type_name, data=data)
        return g.tensor(name, shape, type_name, scale=q[0], zero_point=q[1], data=data)

    box_input = tensor("box_encodings", [1, n, code_size], encodings, encodings_q)
    class_input = tensor("class_predictions", [1, n, columns], predictions, predictions_q)
    anchor_type = {np.float32: "FLOAT32", np.uint8: "UINT8", np.int8: "INT8"}[anchors.dtype.type]
    anchor_tensor = tensor("anchors", [n, 4], anchor_type, anchors_q, data=anchors)
    m = max(int(options["max_detections"] or 0) * int(options["max_classes_per_detection"] or 0), 0)
    shapes = [[1, m, 4], [1, m], [1, m], [1]] if output_shapes else [[]] * 4
    outs = {role: g.tensor(POSTPROCESS_OP if i == 0 else f"{POSTPROCESS_OP}:{i}", shapes[i], "FLOAT32")
            for i, role in enumerate(OUTPUT_ROLES)}
    g.op("CUSTOM", [box_input, class_input, anchor_tensor], [outs[r] for r in OUTPUT_ROLES], custom_code=POSTPROCESS_OP)
    op = g.operators[-1]
    op.customOptions = list(options_bytes if options_bytes is not None else postprocess_options(**options))
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    return g.build([box_input, class_input], [outs[r] for r in OUTPUT_ORDERS[order]])


def ssd_anchors() -> np.ndarray:
    """The 1917 anchors of a 300x300 SSD MobileNet (TF object-detection API's multiple grid anchors: feature maps
    19, 10, 5, 3, 2, 1; 3 boxes per cell on the first, 6 on the others), center-size, normalized, float32."""
    maps, anchors = (19, 10, 5, 3, 2, 1), []
    scales = np.linspace(0.2, 0.95, len(maps)).tolist() + [1.0]
    for layer, cells in enumerate(maps):
        scale, next_scale = scales[layer], scales[layer + 1]
        if layer == 0:
            shapes = [(0.1, 1.0), (scale, 2.0), (scale, 0.5)]
        else:
            shapes = [(scale, r) for r in (1.0, 2.0, 0.5, 3.0, 1 / 3)] + [(np.sqrt(scale * next_scale), 1.0)]
        centers = (np.arange(cells) + 0.5) / cells
        for y in centers:
            for x in centers:
                anchors += [(y, x, s / np.sqrt(r), s * np.sqrt(r)) for s, r in shapes]
    return np.array(anchors, np.float32)


ENCODINGS_Q = (0.05, 128)   # uint8 box encodings of ssd_like_head: (scale, zero point)
SCORES_Q = (1 / 256, 0)     # uint8 class scores after a sigmoid, as TF1 quantized SSDs have them


def ssd_like_head(seed: int, anchors: np.ndarray, num_classes: int, objects: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """What a trained SSD's quantized head hands the post-process op on a photo with a few objects: uint8 box
    encodings [1, N, 4] (ENCODINGS_Q) and uint8 class scores [1, N, num_classes + 1] (SCORES_Q), background
    first. Most class scores sit at 0-3 (ties everywhere); the anchors near each object score high for its class."""
    rng = np.random.default_rng(seed)
    n = anchors.shape[0]
    encodings = np.clip(np.round(rng.normal(0, 1.0, (1, n, 4)) / ENCODINGS_Q[0]) + ENCODINGS_Q[1], 0, 255)
    logits = rng.normal(-6, 1.5, (n, num_classes + 1))
    logits[:, 0] = rng.normal(4, 1.5, n)
    for _ in range(objects):
        center, label = anchors[rng.integers(n)], rng.integers(1, num_classes + 1)
        near = ((np.abs(anchors[:, :2] - center[:2]).max(axis=1) < 0.08)
                & (np.abs(np.log(anchors[:, 2:] / center[2:])).max(axis=1) < 0.7))
        logits[near, label] = rng.normal(1.5, 1.5, int(near.sum()))
        logits[near, 0] = rng.normal(-2, 1, int(near.sum()))
    scores = np.clip(np.round(256 / (1 + np.exp(-logits))), 0, 255)
    return encodings.astype(np.uint8), scores.astype(np.uint8)[None]
