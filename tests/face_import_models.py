"""Models the face import tests build beside tests/face_models.py's: shapes that public face models and Coral's zoo
have, built as flatbuffers in milliseconds, runnable on TFLite and the emulator.

- `retinaface_like()`: a RetinaFace-style detector at 64x64 (int8 input, (pixel - 128) / 128): boxes [1, 168, 4],
  scores [1, 168, 2] (logits) and landmarks [1, 168, 10] over RetinaFace's 168 priors at that size. Its outputs are
  constants whatever the image (a FULLY_CONNECTED with zero weights: its biases are the values), so it finds one
  face, FACE_BOX with its 5 FACE_LANDMARKS (fractions of the input), on every image: what the test checks is the
  decode, the landmarks' way back to the photo's pixels, and the import's recognition.

      image -> AVERAGE_POOL 64x64 -> RESHAPE [1, 3] -> FULLY_CONNECTED (0 weights, bias = the values) -> RESHAPE

- `embedding_extractor()`: Coral's embedding extractor's shape (MobileNet v1 without its classifier): 32x32 uint8,
  a 1x1 convolution to 1024 channels, AVERAGE_POOL over the map, RESHAPE [1, 1024]: pooled features, no labels.
- `two_vectors()`: an embedder with two vector outputs, [1, 40] and [1, 36]: which is the embedding only a flag says.
"""

from __future__ import annotations

import numpy as np

from app.tasks.priors import RETINAFACE
from tests.tflite_builder import GraphBuilder

RETINA_SIZE = 64
RETINA_PRIORS = len(RETINAFACE.for_input(RETINA_SIZE, RETINA_SIZE))  # 8x8x2 + 4x4x2 + 2x2x2 = 168
FACE_PRIOR = (4 * 8 + 3) * 2  # the 16-pixel prior of cell (x 3, y 4) of the stride-8 map: centre (0.4375, 0.5625)
# its raw outputs: locations (multiples of 1/64), logits (background, face), landmark offsets (multiples of 1/40)
FACE_LOCATION = (0.5, -0.5, 58 / 64, 108 / 64)
FACE_LOGITS, OTHER_LOGITS = (-4.0, 4.0), (4.0, -4.0)
FACE_OFFSETS = ((-1.5, -2.5), (2.5, -2.5), (0.5, -0.1), (-1.1, 2.3), (2.1, 2.3))
LOCATIONS_Q, LOGITS_Q, LANDMARKS_Q = (1 / 64, 0), (1 / 16, 0), (1 / 40, 0)


def _prior() -> np.ndarray:
    return RETINAFACE.for_input(RETINA_SIZE, RETINA_SIZE).priors().boxes[FACE_PRIOR].astype(np.float64)


def face_box() -> tuple[float, float, float, float]:
    """The face's box (x1, y1, x2, y2), fractions of the input: the decode of FACE_LOCATION on its prior."""
    cx, cy, w, h = _prior()
    l0, l1, l2, l3 = FACE_LOCATION
    x, y = cx + l0 * 0.1 * w, cy + l1 * 0.1 * h
    bw, bh = w * np.exp(l2 * 0.2), h * np.exp(l3 * 0.2)
    return x - bw / 2, y - bh / 2, x + bw / 2, y + bh / 2


def face_landmarks() -> np.ndarray:
    """Its 5 landmarks [5, 2] (x, y), fractions of the input: prior centre + offset x 0.1 x prior size."""
    cx, cy, w, h = _prior()
    return np.array([(cx + dx * 0.1 * w, cy + dy * 0.1 * h) for dx, dy in FACE_OFFSETS])


def _constant_output(g: GraphBuilder, name: str, source: int, values: np.ndarray, q: tuple[float, int]) -> int:
    """A FULLY_CONNECTED with zero weights from `source` [1, 3] (int8, scale 1/128) whose bias is `values` [N, k],
    reshaped to [1, N, k]: the output is `values`, quantized with q."""
    flat = values.reshape(-1)
    weights = g.tensor(f"{name}/weights", [len(flat), 3], "INT8", scale=1.0, zero_point=0,
                       data=np.zeros((len(flat), 3)))
    bias_scale = 1 / 128  # input scale x weight scale
    bias = g.tensor(f"{name}/bias", [len(flat)], "INT32", scale=bias_scale, zero_point=0,
                    data=np.round(flat / bias_scale))
    dense = g.tensor(f"{name}/dense", [1, len(flat)], "INT8", scale=q[0], zero_point=q[1])
    g.op("FULLY_CONNECTED", [source, weights, bias], [dense])
    shape = [1, *values.shape]
    out = g.tensor(name, shape, "INT8", scale=q[0], zero_point=q[1])
    g.op("RESHAPE", [dense, g.constant(f"{name}/shape", shape)], [out], newShape=shape)
    return out


def retinaface_like(order: tuple[str, ...] = ("boxes", "scores", "landmarks"), rows: int = RETINA_PRIORS) -> bytes:
    """The RetinaFace-style detector (module docstring), its outputs listed in `order`; `rows` other than its
    priors' count makes one whose priors no built-in set has."""
    size, n = RETINA_SIZE, rows
    g = GraphBuilder()
    image = g.tensor("input", [1, size, size, 3], "INT8", scale=1 / 128, zero_point=0)
    pooled = g.tensor("pooled", [1, 1, 1, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("AVERAGE_POOL_2D", [image], [pooled], padding="VALID", strideW=size, strideH=size, filterWidth=size,
         filterHeight=size)
    flat = g.tensor("pooled/flat", [1, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("RESHAPE", [pooled, g.constant("pooled/shape", [1, 3])], [flat], newShape=[1, 3])
    locations = np.zeros((n, 4))
    locations[FACE_PRIOR] = FACE_LOCATION
    logits = np.tile(OTHER_LOGITS, (n, 1))
    logits[FACE_PRIOR] = FACE_LOGITS
    offsets = np.zeros((n, 10))
    offsets[FACE_PRIOR] = np.ravel(FACE_OFFSETS)
    outputs = {"boxes": _constant_output(g, "bbox_regressions", flat, locations, LOCATIONS_Q),
               "scores": _constant_output(g, "classifications", flat, logits, LOGITS_Q),
               "landmarks": _constant_output(g, "ldm_regressions", flat, offsets, LANDMARKS_Q)}
    return g.build([image], [outputs[role] for role in order])


def embedding_extractor(channels: int = 1024, size: int = 32) -> bytes:
    """Coral's embedding extractor's shape (module docstring)."""
    g = GraphBuilder()
    image = g.tensor("input", [1, size, size, 3], "UINT8", scale=1 / 128, zero_point=128)
    x = g.tensor("input/int8", [1, size, size, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("QUANTIZE", [image], [x])
    weights = np.cos(np.arange(channels * 3).reshape(channels, 1, 1, 3) * 0.7)
    w = g.tensor("features/weights", weights.shape, "INT8", scale=[1 / 127] * channels, zero_point=[0] * channels,
                 data=np.round(weights * 127))
    b = g.tensor("features/bias", [channels], "INT32", scale=[1 / 128 / 127] * channels, zero_point=[0] * channels,
                 data=np.zeros(channels))
    features = g.tensor("features", [1, size, size, channels], "INT8", scale=3 / 127, zero_point=0)
    g.op("CONV_2D", [x, w, b], [features], padding="VALID", strideW=1, strideH=1, dilationWFactor=1,
         dilationHFactor=1)
    pooled = g.tensor("MobilenetV1/Logits/AvgPool_1a/AvgPool", [1, 1, 1, channels], "INT8", scale=3 / 127,
                      zero_point=0)
    g.op("AVERAGE_POOL_2D", [features], [pooled], padding="VALID", strideW=size, strideH=size, filterWidth=size,
         filterHeight=size)
    out = g.tensor("embedding", [1, channels], "INT8", scale=3 / 127, zero_point=0)
    g.op("RESHAPE", [pooled, g.constant("embedding/shape", [1, channels])], [out], newShape=[1, channels])
    return g.build([image], [out])


def two_vectors() -> bytes:
    """An embedder with two vector outputs, `first` [1, 40] and `second` [1, 36]."""
    g = GraphBuilder()
    image = g.tensor("input", [1, 8, 8, 3], "INT8", scale=1 / 128, zero_point=0)
    pooled = g.tensor("pooled", [1, 1, 1, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("AVERAGE_POOL_2D", [image], [pooled], padding="VALID", strideW=8, strideH=8, filterWidth=8, filterHeight=8)
    flat = g.tensor("pooled/flat", [1, 3], "INT8", scale=1 / 128, zero_point=0)
    g.op("RESHAPE", [pooled, g.constant("pooled/shape", [1, 3])], [flat], newShape=[1, 3])
    outputs = []
    for name, size in (("first", 40), ("second", 36)):
        w = g.tensor(f"{name}/weights", [size, 3], "INT8", scale=1 / 127, zero_point=0,
                     data=np.round(np.sin(np.arange(size * 3).reshape(size, 3)) * 127))
        b = g.tensor(f"{name}/bias", [size], "INT32", scale=1 / 128 / 127, zero_point=0, data=np.zeros(size))
        out = g.tensor(name, [1, size], "INT8", scale=3 / 127, zero_point=0)
        g.op("FULLY_CONNECTED", [flat, w, b], [out])
        outputs.append(out)
    return g.build([image], outputs)
