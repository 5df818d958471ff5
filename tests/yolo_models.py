"""Detector test models in every layout a Coral owner brings, whose outputs place known boxes.

Real exports (TensorFlow, quantized with the project's own converter, converter/quantize.py), a few seconds each,
cached for the test process (lru_cache):

- `frigate_like()`: YOLO in the Coral layout Frigate serves, class logits [1, 84, 3] + DFL [1, 84, 64];
- `ultralytics_like()`: Ultralytics' one tensor [1, 7, 84] (or transposed [1, 84, 7]), the DFL decoded inside the
  graph (SOFTMAX, the expected bin by FULLY_CONNECTED, anchors by SUB/ADD/MUL), class scores through a LOGISTIC,
  boxes xywh as fractions of the input (or pixels); `calibrated_over` reproduces an export whose input was
  calibrated over a range its maker never feeds (Ultralytics' 8.2.23 and 8.3.82 exports: ImageNet's normalization,
  [-2.1179, 2.64], an int8 input quantized (0.018658, -14), fed pixels / 255);
- `tf2_ssd()`: an SSD ending in TFLite_Detection_PostProcess, its outputs in TF2's order (scores, boxes, count,
  classes), with the PACK ops of the TF object-detection API's FPN upsampling (tf.stack + reshape), uint8 input
  and float outputs, as a TF2 "SSD MobileNetV2 FPNLite" export has them.

The YOLO heads see a 64x64 RGB image through grids of strides 8, 16 and 32 (84 anchors). A cell scores for
class c (red, green, blue) when it is lit in channel c and its 8 neighbours are dark (a centre-surround 3x3
convolution over the cells' mean brightness): a square of side s on the stride-s grid lights exactly one cell
of that grid, strongly; the finer grids see a block of lit cells and the coarser ones a partly lit cell, both
scoring low. Every side's DFL bins favour bins 0 and 1 equally, so each box is its cell: the detection is the
square. `squares()` draws such scenes and gives the boxes they must produce.

Fast graph stubs (no TensorFlow, tests/tflite_builder.py) give the importer every output shape, type and
quantization to recognise: `yolo_stub()`.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from app.tasks import yolo
from tests.detection_models import grid_anchors
from tests.tflite_builder import GraphBuilder

SIZE = 64
STRIDES = (8, 16, 32)
CLASSES = ("red", "green", "blue")
N = yolo.anchor_count(SIZE, SIZE, STRIDES)  # 64 + 16 + 4
REG_MAX = 16
# class logit of a cell: GAIN x (8 x its brightness - its 8 neighbours') + BIAS: a lone lit cell 2 x 8 - 12 = +4
# (0.98), the corner of a 2x2 block 2 x 5 - 12 = -2 (0.12), a dark cell -12
GAIN, BIAS = 2.0, -12.0
MIN_SCORE = 0.5


@dataclass(frozen=True)
class Square:
    top: int
    left: int
    side: int
    colour: int  # 0 red, 1 green, 2 blue: the class
    image: int = SIZE  # the image's side

    @property
    def box(self) -> tuple[float, float, float, float]:
        """(ymin, xmin, ymax, xmax) normalized to the input."""
        size = self.image
        return (self.top / size, self.left / size, (self.top + self.side) / size, (self.left + self.side) / size)


SCENE = (Square(0, 0, 8, 0), Square(16, 32, 16, 1), Square(32, 0, 32, 2))


def squares(scene=SCENE, size: int = SIZE) -> np.ndarray:
    """Black, with each square lit in its colour: uint8 HxWx3."""
    pixels = np.zeros((size, size, 3), np.uint8)
    for s in scene:
        pixels[s.top:s.top + s.side, s.left:s.left + s.side, s.colour] = 255
    return pixels


# ImageNet's normalization of 0..1, (x - 0.485) / 0.229 .. (x - 0.406) / 0.225 over the channels: the range an
# Ultralytics export's int8 input was calibrated over (0.018658 x (q + 14))
IMAGENET_RANGE = (-2.1179, 2.64)


def calibration(count: int = 24, seed: int = 0, over: tuple[float, float] | None = None):
    """Representative inputs, float32 [1, 64, 64, 3] in [0, 1]: a few aligned squares of every size and colour. With
    `over`, one pixel of each at its low end and one at its high end: the input's quantization spans `over` (a range
    its maker never feeds), the rest of the model is calibrated on what it is fed."""

    def inputs():
        rng = np.random.default_rng(seed)
        for _ in range(count):
            scene = []
            for _ in range(3):
                side = STRIDES[rng.integers(len(STRIDES))]
                row, col = rng.integers(SIZE // side, size=2)
                scene.append(Square(int(row * side), int(col * side), int(side), int(rng.integers(3))))
            x = (squares(scene) / 255.0).astype(np.float32)[None]
            if over is not None:
                x[0, 0, 0, 0], x[0, 0, 1, 0] = over
            yield x
    return inputs


# ---- the Keras heads ----------------------------------------------------------------------------------------------

def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from converter.quantize import import_tensorflow

    return import_tensorflow()


def _levels(inputs, block=None):
    """Per stride: class logits [1, g*g, 3] and DFL bin logits [1, g*g, 64] (Keras tensors). block(cells, stride),
    if given, transforms each level's cells first (tests/emulator_yolo11.py puts YOLO11's attention there)."""
    from keras import layers

    heads = []
    centre_surround = np.zeros((3, 3, 3, 3), np.float32)
    for c in range(3):
        centre_surround[:, :, c, c] = -1.0
        centre_surround[1, 1, c, c] = 8.0
    favoured = [side * REG_MAX + k for side in range(4) for k in (0, 1)]
    bins = np.full((1, 1, 3, 4 * REG_MAX), -8.0, np.float32)
    bins[..., favoured] = 8.0
    bins_bias = np.zeros(4 * REG_MAX, np.float32)
    bins_bias[favoured] = 6.0
    for stride in STRIDES:
        g = SIZE // stride
        cells = layers.AveragePooling2D(stride, name=f"cells_{stride}")(inputs)
        cells = cells if block is None else block(cells, stride)
        logits = layers.Conv2D(3, 3, padding="same", name=f"logits_{stride}")
        dfl = layers.Conv2D(4 * REG_MAX, 1, name=f"dfl_{stride}")
        heads.append((layers.Reshape((g * g, 3))(logits(cells)), layers.Reshape((g * g, 4 * REG_MAX))(dfl(cells))))
        logits.set_weights([centre_surround * GAIN, np.full(3, BIAS, np.float32)])
        dfl.set_weights([bins, bins_bias])
    return heads


def _convert(model, io_type: str, output_type: str | None = None, over: tuple[float, float] | None = None) -> bytes:
    from converter.quantize import export_keras, quantize

    with tempfile.TemporaryDirectory() as workdir:
        return quantize(export_keras(model, workdir), calibration(over=over), io_type=io_type, output_type=output_type)


@lru_cache(maxsize=None)
def frigate_like(io_type: str = "int8") -> bytes:
    """Class logits [1, 84, 3] and DFL bins [1, 84, 64]: the Coral layout Frigate's yolo-generic reads."""
    _tf()
    import keras
    from keras import layers

    inputs = keras.Input((SIZE, SIZE, 3), batch_size=1)
    heads = _levels(inputs)
    logits = layers.Concatenate(axis=1, name="class_logits")([h[0] for h in heads])
    dfl = layers.Concatenate(axis=1, name="box_distributions")([h[1] for h in heads])
    return _convert(keras.Model(inputs, [logits, dfl]), io_type)


@lru_cache(maxsize=None)
def ultralytics_like(io_type: str = "int8", transposed: bool = False, box_scale: str = "normalized",
                     output_type: str | None = None, calibrated_over: tuple[float, float] | None = None,
                     block=None) -> bytes:
    """Ultralytics' one tensor: [1, 4 + 3, 84] (or [1, 84, 7] transposed), boxes xywh, then sigmoid class scores;
    its input quantized over `calibrated_over` where given (IMAGENET_RANGE: Ultralytics' artefact); `block` adds an
    attention block to each level (YOLO11's C2PSA, tests/emulator_yolo11.py)."""
    _tf()
    import keras
    from keras import layers, ops

    centres, steps = yolo.anchors(SIZE, SIZE, STRIDES)
    unit = 1 / SIZE if box_scale == "normalized" else 1.0
    points = (centres * steps[:, None] * unit).astype(np.float32)   # each anchor's centre, in the boxes' unit
    per_anchor = (steps * unit).astype(np.float32)                  # a cell, in the boxes' unit

    class Boxes(layers.Layer):
        """Ultralytics' dist2bbox(xywh=True) on anchors scaled beforehand (its tflite route, ultralytics#7371):
        distances (l, t, r, b) in cells -> centre = anchor + (rb - lt) / 2, size = lt + rb, in the boxes' unit."""

        def call(self, distances):
            lt, rb = distances[..., :2], distances[..., 2:]
            scale = ops.convert_to_tensor(per_anchor)[None, :, None]
            centre = ops.convert_to_tensor(points)[None] + (rb - lt) * (scale * 0.5)
            return ops.concatenate([centre, (lt + rb) * scale], axis=-1)

    inputs = keras.Input((SIZE, SIZE, 3), batch_size=1)
    heads = _levels(inputs, block)
    logits = layers.Concatenate(axis=1)([h[0] for h in heads])
    dfl = layers.Concatenate(axis=1)([h[1] for h in heads])
    probabilities = layers.Softmax(axis=-1)(layers.Reshape((N, 4, REG_MAX))(dfl))
    expectation = layers.Dense(1, use_bias=False, name="dfl")
    distances = layers.Reshape((N, 4))(expectation(probabilities))
    expectation.set_weights([np.arange(REG_MAX, dtype=np.float32)[:, None]])
    rows = layers.Concatenate(axis=-1)([Boxes()(distances), layers.Activation("sigmoid")(logits)])
    output = rows if transposed else layers.Permute((2, 1))(rows)
    return _convert(keras.Model(inputs, output), io_type, output_type, calibrated_over)


# ---- an SSD exported by the TF object-detection API's TF2 route -----------------------------------------------------

SSD_SIZE = 32
SSD_CLASSES = ("red", "green")
SSD_OPTIONS = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100, use_regular_nms=False,
                   nms_score_threshold=0.3, nms_iou_threshold=0.5, num_classes=len(SSD_CLASSES), y_scale=10.0,
                   x_scale=10.0, h_scale=5.0, w_scale=5.0)
# a red 8x8 square on the stride-8 grid, a green 16x16 one on the stride-16 grid
SSD_SCENE = (Square(8, 16, 8, 0, SSD_SIZE), Square(16, 0, 16, 1, SSD_SIZE))


def _implements() -> str:
    """The TF object-detection API's composite-function signature that the converter turns into the custom op."""
    from tensorflow.core.framework import attr_value_pb2

    text = "name: 'TFLite_Detection_PostProcess'"
    for key, value in SSD_OPTIONS.items():
        if isinstance(value, bool):
            attr = attr_value_pb2.AttrValue(b=value)
        elif isinstance(value, int):
            attr = attr_value_pb2.AttrValue(i=value)
        else:
            attr = attr_value_pb2.AttrValue(f=value)
        text += f" attr {{ key: '{key}' value {{ {str(attr).strip()} }} }}"
    return text


@lru_cache(maxsize=None)
def tf2_ssd() -> bytes:
    """An FPN-style SSD, 32x32 RGB: a stride-8 grid (4x4) and a stride-16 grid (2x2), one anchor a cell.

    The stride-16 features come back to the stride-8 grid by nearest-neighbour upsampling written as the TF
    object-detection API writes it (tf.stack twice, then a reshape: two PACK ops of rank 5 and 6), and a stride-8
    cell scores for colour c by 2 x its brightness minus its stride-16 cell's (lit alone: 1.75; inside a lit
    stride-16 cell: 1), a stride-16 cell by its brightness (1 when lit whole, 0.25 under one lit stride-8 cell).
    Box encodings stay near 0, so each box is its anchor, the cell."""
    tf = _tf()
    from converter.quantize import quantize

    classes = len(SSD_CLASSES)
    anchors = np.concatenate([grid_anchors(4), grid_anchors(2)])
    average8 = np.zeros((8, 8, 3, 3), np.float32)
    for c in range(3):
        average8[:, :, c, c] = 1 / 64
    average16 = np.zeros((2, 2, 3, 3), np.float32)
    for c in range(3):
        average16[:, :, c, c] = 1 / 4

    def head(threshold: float) -> tuple[np.ndarray, np.ndarray]:
        weights = np.zeros((1, 1, 3, classes + 1), np.float32)
        weights[0, 0, :, 0] = -1.0      # the background column, which the op skips
        bias = np.zeros(classes + 1, np.float32)
        for c in range(classes):
            weights[0, 0, c, c + 1] = 8.0
            bias[c + 1] = -8.0 * threshold
        return weights, bias

    class Detector(tf.Module):
        def __init__(self):
            self.average8, self.average16 = tf.constant(average8), tf.constant(average16)
            self.fine, self.coarse = (tuple(tf.constant(a) for a in head(t)) for t in (1.4, 0.6))
            self.boxes = tf.constant(np.full((1, 1, 3, 4), 1e-3, np.float32))
            self.anchors = tf.constant(anchors)

        @tf.function(experimental_implements=_implements())
        def postprocess(self, box_encodings, class_predictions, anchors):
            nothing = tf.constant(0.0)
            return nothing, nothing, nothing, nothing

        @tf.function(input_signature=[tf.TensorSpec([1, SSD_SIZE, SSD_SIZE, 3], tf.float32)])
        def __call__(self, image):
            fine = tf.nn.conv2d(image, self.average8, 8, "VALID")             # [1, 4, 4, 3]
            coarse = tf.nn.conv2d(fine, self.average16, 2, "VALID")           # [1, 2, 2, 3]
            up = tf.stack([coarse] * 2, axis=3)                               # object_detection.utils.ops
            up = tf.reshape(tf.stack([up] * 2, axis=2), [1, 4, 4, 3])         # .nearest_neighbor_upsampling
            levels = ((2.0 * fine - up, self.fine, 4), (coarse, self.coarse, 2))
            boxes, logits = [], []
            for features, (weights, bias), cells in levels:
                logits.append(tf.reshape(tf.nn.conv2d(features, weights, 1, "VALID") + bias,
                                         [1, cells * cells, classes + 1]))
                boxes.append(tf.reshape(tf.nn.conv2d(features, self.boxes, 1, "VALID"), [1, cells * cells, 4]))
            return self.postprocess(tf.concat(boxes, axis=1), tf.sigmoid(tf.concat(logits, axis=1)), self.anchors)

    detector = Detector()

    def inputs():
        rng = np.random.default_rng(1)
        for _ in range(24):
            scene = [Square(int(r * s), int(c * s), s, int(rng.integers(2)))
                     for s in (8, 16) for r, c in [rng.integers(SSD_SIZE // s, size=2)]]
            yield (squares(scene, SSD_SIZE) / 255.0).astype(np.float32)[None]

    with tempfile.TemporaryDirectory() as workdir:
        tf.saved_model.save(detector, workdir, signatures=detector.__call__.get_concrete_function())
        return quantize(workdir, inputs, io_type="uint8", output_type="float32")


# ---- stubs: the outputs' shapes, types and quantization, for the importer --------------------------------------

@dataclass(frozen=True)
class Out:
    """One output of a stub: its name, per-anchor values, and how it is laid out and typed."""

    name: str
    values: int                       # per candidate
    transposed: bool = False          # [1, values, N] rather than [1, N, values]
    type: str = "INT8"
    scale: float = 1 / 255
    zero_point: int = -128
    anchors_per_cell: int = 1
    dequantized: bool = False         # a float output made by DEQUANTIZE
    logistic: bool = False            # made through a LOGISTIC


def yolo_stub(outputs: list[Out], size: int = SIZE, input_type: str = "INT8", strides=STRIDES,
              metadata: dict | None = None, metadata_form: str = "json",
              input_quantization: tuple[float, int] | None = None) -> bytes:
    """A graph shaped like a YOLO head's end: per stride a 1x1 CONV_2D of that stride, reshaped to [1, cells, k] and
    concatenated over the strides, then (per output) a TRANSPOSE, LOGISTIC or DEQUANTIZE; `metadata` is appended
    as Ultralytics appends it (with_ultralytics_metadata's forms). The input is quantized (1/255, its type's lowest
    value), or as `input_quantization` says. Never run: for the importer to read."""
    g = GraphBuilder()
    scale, zero = input_quantization or (1 / 255, -128 if input_type == "INT8" else 0)
    image = g.tensor("image", [1, size, size, 3], input_type, scale=scale, zero_point=zero)
    ends = []
    for out in outputs:
        width = out.values * out.anchors_per_cell
        parts = []
        for stride in strides:
            cells = (size // stride) ** 2
            w = g.tensor(f"{out.name}/w{stride}", [width, 1, 1, 3], input_type, scale=[0.01] * width,
                         zero_point=[0] * width, data=np.ones((width, 1, 1, 3)), axis=0)
            b = g.constant(f"{out.name}/b{stride}", np.zeros(width), "INT32")
            conv = g.tensor(f"{out.name}/conv{stride}", [1, size // stride, size // stride, width], out.type,
                            scale=out.scale, zero_point=out.zero_point)
            g.op("CONV_2D", [image, w, b], [conv], padding="VALID", strideW=stride, strideH=stride,
                 dilationWFactor=1, dilationHFactor=1)
            flat = g.tensor(f"{out.name}/flat{stride}", [1, cells * out.anchors_per_cell, out.values], out.type,
                            scale=out.scale, zero_point=out.zero_point)
            g.op("RESHAPE", [conv, g.constant(f"{out.name}/shape{stride}", [1, cells * out.anchors_per_cell,
                                                                               out.values])], [flat])
            parts.append(flat)
        n = sum((size // s) ** 2 for s in strides) * out.anchors_per_cell
        joined = g.tensor(f"{out.name}/joined", [1, n, out.values], out.type, scale=out.scale,
                          zero_point=out.zero_point)
        g.op("CONCATENATION", parts, [joined], axis=1)
        if out.logistic:
            made = g.tensor(f"{out.name}/sigmoid", [1, n, out.values], out.type, scale=1 / 256,
                            zero_point=-128 if out.type == "INT8" else 0)
            g.op("LOGISTIC", [joined], [made])
            joined = made
        shape = [1, out.values, n] if out.transposed else [1, n, out.values]
        scale = 1 / 256 if out.logistic else out.scale
        zero_point = (-128 if out.type == "INT8" else 0) if out.logistic else out.zero_point
        final = g.tensor(out.name if not out.dequantized else f"{out.name}/int8", shape, out.type, scale=scale,
                         zero_point=zero_point)
        if out.transposed:
            g.op("TRANSPOSE", [joined, g.constant(f"{out.name}/perm", [0, 2, 1])], [final])
        else:
            g.op("RESHAPE", [joined, g.constant(f"{out.name}/same", shape)], [final])
        if out.dequantized:
            floating = g.tensor(out.name, shape, "FLOAT32")
            g.op("DEQUANTIZE", [final], [floating])
            final = floating
        ends.append(final)
    data = g.build([image], ends)
    return data if metadata is None else with_ultralytics_metadata(data, metadata, metadata_form)


def with_ultralytics_metadata(data: bytes, metadata: dict, form: str = "json") -> bytes:
    """The file with Ultralytics' metadata in a zip appended (zipfile, mode "a"), in either of its forms: `json`,
    metadata.json (8.4); `literal`, temp_meta.txt holding str() of the dict, single quotes and int keys (8.2-8.3)."""
    buffer = io.BytesIO(data)
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        if form == "json":
            archive.writestr("metadata.json", json.dumps(metadata, indent=2))
        else:
            literal = dict(metadata, names={int(k): v for k, v in metadata["names"].items()})
            archive.writestr("temp_meta.txt", str(literal))
    return buffer.getvalue()


def ultralytics_metadata(names: list[str], task: str = "detect", imgsz: int = SIZE, version: str = "8.3.0") -> dict:
    """What Ultralytics' exporter writes (its fields, with made-up values)."""
    return {"description": "Ultralytics YOLO11n model trained on test.yaml", "author": "Ultralytics",
            "date": "2026-01-01T00:00:00", "version": version, "license": "AGPL-3.0 License", "docs": "",
            "stride": 32, "task": task, "batch": 1, "imgsz": [imgsz, imgsz],
            "names": {str(i): name for i, name in enumerate(names)}, "args": {"nms": False}}
