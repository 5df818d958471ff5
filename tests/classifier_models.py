"""Tiny image classifiers built as flatbuffers, in the shapes Coral owners download them.

    style "tf1":  uint8 image -> CONV_2D (uint8) -> AVERAGE_POOL_2D -> RESHAPE -> FULLY_CONNECTED -> SOFTMAX
                  (uint8 everywhere, as TF1's quantization-aware exports: Coral's mobilenet_v1_*_quant)
    style "tf2":  uint8|int8 image -> [QUANTIZE] -> CONV_2D (int8, per channel) -> ... -> SOFTMAX -> [QUANTIZE]
                  (int8 inside, as TF2's post-training quantization with uint8 or int8 I/O)
    io "float":   style tf2 with float32 at both edges: QUANTIZE in, DEQUANTIZE out

The weights are chosen so the classes answer to colour: class k's score rises with channel
k % 3's mean brightness, so a red, green or blue photo picks a different class on every
backend. Small enough to build in milliseconds and to run on TFLite and the emulator.

    model_bytes = tiny_classifier(size=16, classes=4, style="tf1")
"""

from __future__ import annotations

import numpy as np

from tests.tflite_builder import GraphBuilder


def tiny_classifier(size: int = 16, classes: int = 4, style: str = "tf2", io: str = "uint8",
                    softmax: bool = True, channels: int = 3) -> bytes:
    """A classifier of size x size images with `classes` outputs (see the module docstring)."""
    if style not in ("tf1", "tf2"):
        raise ValueError(f"style is 'tf1' or 'tf2', not {style!r}")
    g = GraphBuilder()
    inner = "UINT8" if style == "tf1" else "INT8"
    offset = 0 if inner == "UINT8" else -128  # zero points of the inner type, shifted from uint8's
    if io == "float":
        image = g.tensor("image", [1, size, size, channels], "FLOAT32")
    else:
        image = g.tensor("image", [1, size, size, channels], "UINT8" if io == "uint8" else "INT8",
                         scale=1 / 128, zero_point=128 if io == "uint8" else 0)
    x = image
    if style == "tf2" or io == "float":
        x = g.tensor("image/quantized", [1, size, size, channels], inner, scale=1 / 128, zero_point=128 + offset)
        g.op("QUANTIZE", [image], [x])

    cells = size // 4
    features = 8
    weights = np.zeros((features, 4, 4, channels))
    for f in range(features):
        weights[f, :, :, f % channels] = 1.0  # feature f: the cell's mean of channel f % channels
    w_scale = 1 / 64
    wq = np.round(weights / w_scale) + (128 if inner == "UINT8" else 0)
    w = g.tensor("conv/weights", weights.shape, inner, scale=w_scale if inner == "UINT8" else [w_scale] * features,
                 zero_point=128 if inner == "UINT8" else [0] * features, data=wq)
    bias_scale = (1 / 128) * w_scale
    b = g.tensor("conv/bias", [features], "INT32", scale=bias_scale if inner == "UINT8" else [bias_scale] * features,
                 zero_point=0 if inner == "UINT8" else [0] * features, data=np.zeros(features))
    conv = g.tensor("conv", [1, cells, cells, features], inner, scale=0.25, zero_point=offset + (0 if offset else 0))
    g.op("CONV_2D", [x, w, b], [conv], padding="VALID", strideW=4, strideH=4, dilationWFactor=1, dilationHFactor=1,
         fusedActivationFunction="RELU")
    pooled = g.tensor("pool", [1, 1, 1, features], inner, scale=0.25, zero_point=offset)
    g.op("AVERAGE_POOL_2D", [conv], [pooled], padding="VALID", strideW=1, strideH=1, filterWidth=cells,
         filterHeight=cells)
    shape = g.constant("flatten/shape", [1, features])
    flat = g.tensor("flatten", [1, features], inner, scale=0.25, zero_point=offset)
    g.op("RESHAPE", [pooled, shape], [flat], newShape=[1, features])

    fc = np.zeros((classes, features))
    for k in range(classes):
        fc[k, k % channels] = 1.0
        fc[k] -= 0.1 * (k // channels)  # later classes of the same colour score a little lower
    fc_scale = 1 / 64
    fq = np.round(fc / fc_scale) + (128 if inner == "UINT8" else 0)
    fw = g.tensor("logits/weights", fc.shape, inner, scale=fc_scale, zero_point=128 if inner == "UINT8" else 0, data=fq)
    fb = g.tensor("logits/bias", [classes], "INT32", scale=0.25 * fc_scale, zero_point=0, data=np.zeros(classes))
    logits = g.tensor("logits", [1, classes], inner, scale=0.1, zero_point=offset + 128 if inner == "INT8" else 128)
    g.op("FULLY_CONNECTED", [flat, fw, fb], [logits])
    out = logits
    if softmax:
        out = g.tensor("probabilities", [1, classes], inner, scale=1 / 256, zero_point=offset)
        g.op("SOFTMAX", [logits], [out], beta=1.0)
    if io == "float":
        result = g.tensor("scores", [1, classes], "FLOAT32")
        g.op("DEQUANTIZE", [out], [result])
        out = result
    elif style == "tf2" and io == "uint8":
        q = g.tensors[out].quantization
        result = g.tensor("scores", [1, classes], "UINT8", scale=q.scale[0], zero_point=q.zeroPoint[0] + 128)
        g.op("QUANTIZE", [out], [result])
        out = result
    return g.build([image], [out])


def two_input_model() -> bytes:
    """Two image inputs added together: a model the importer refuses (the service feeds one image)."""
    g = GraphBuilder()
    a = g.tensor("a", [1, 8, 8, 3], "UINT8", scale=1 / 128, zero_point=128)
    b = g.tensor("b", [1, 8, 8, 3], "UINT8", scale=1 / 128, zero_point=128)
    out = g.tensor("sum", [1, 8, 8, 3], "UINT8", scale=1 / 64, zero_point=128)
    g.op("ADD", [a, b], [out])
    return g.build([a, b], [out])


def feature_model() -> bytes:
    """A [1, 64] feature-vector input: not an image."""
    g = GraphBuilder()
    x = g.tensor("features", [1, 64], "UINT8", scale=1 / 128, zero_point=128)
    w = g.tensor("w", [4, 64], "UINT8", scale=1 / 64, zero_point=128, data=np.full((4, 64), 130))
    b = g.tensor("b", [4], "INT32", scale=1 / 128 / 64, zero_point=0, data=np.zeros(4))
    out = g.tensor("scores", [1, 4], "UINT8", scale=0.1, zero_point=128)
    g.op("FULLY_CONNECTED", [x, w, b], [out])
    return g.build([x], [out])


def float_classifier(size: int = 8, classes: int = 3) -> bytes:
    """A float32 model (no quantization at all): what `quantize` is for, not `import`."""
    g = GraphBuilder()
    x = g.tensor("image", [1, size, size, 3], "FLOAT32")
    shape = g.constant("flatten/shape", [1, size * size * 3])
    flat = g.tensor("flatten", [1, size * size * 3], "FLOAT32")
    g.op("RESHAPE", [x, shape], [flat], newShape=[1, size * size * 3])
    w = g.tensor("w", [classes, size * size * 3], "FLOAT32", data=np.full((classes, size * size * 3), 0.01))
    b = g.tensor("b", [classes], "FLOAT32", data=np.zeros(classes))
    out = g.tensor("logits", [1, classes], "FLOAT32")
    g.op("FULLY_CONNECTED", [flat, w, b], [out])
    return g.build([x], [out])
