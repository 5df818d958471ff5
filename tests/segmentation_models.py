"""A small Keras segmenter shaped like Coral's DeepLab files, quantized by the project's converter.

    uint8 image [1, 32, 32, 3] -> QUANTIZE -> CONV_2D 3x3 stride 2 (each channel's local mean) -> CONV_2D 1x1
      (background, red, green scores at 16x16) -> RESIZE_BILINEAR to 32x32 -> ARG_MAX over the classes
      -> int64 [1, 32, 32]: a class map at the input's size, as DeepLab's ArgMax [1, 513, 513]

The weights are chosen, not trained: a pixel is "red" where red stands out from green and blue, "green"
likewise, "background" elsewhere, so a red or green shape drawn on grey comes back as its region.
converter/quantize.py quantizes it (full int8, uint8 input, calibrated on such drawings);
the ARG_MAX keeps its int64 output.

    model_bytes = build_segmenter()
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

SIZE = 32
LABELS = ("background", "red", "green")
COLOURS = {1: (230, 30, 40), 2: (40, 200, 60)}
MEAN = STD = 127.5
CALIBRATION = 40
SEED = 0


def drawing(rng: np.random.Generator, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """A grey, noisy picture with a red and a green rectangle; with its true class of every pixel."""
    grey = rng.integers(60, 190)
    pixels = np.clip(rng.normal(grey, 12, (size, size, 3)), 0, 255)
    truth = np.zeros((size, size), np.int64)
    for class_id, colour in COLOURS.items():
        h, w = rng.integers(size // 4, size // 2, 2)
        top, left = rng.integers(0, size - h), rng.integers(0, size - w)
        pixels[top:top + h, left:left + w] = colour
        truth[top:top + h, left:left + w] = class_id
    return pixels.astype(np.uint8), truth


def shapes_image(width: int, height: int, boxes: dict[int, tuple[int, int, int, int]]) -> np.ndarray:
    """A grey width x height picture with a filled rectangle (left, top, right, bottom) per class id."""
    pixels = np.full((height, width, 3), 128, np.uint8)
    for class_id, (left, top, right, bottom) in boxes.items():
        pixels[top:bottom, left:right] = COLOURS[class_id]
    return pixels


def build_segmenter() -> bytes:
    from converter.quantize import export_keras, import_tensorflow, quantize

    tf = import_tensorflow()
    import keras

    class ArgMax(keras.layers.Layer):
        def call(self, scores):
            return tf.math.argmax(scores, axis=-1, output_type=tf.int64)

    inputs = keras.Input((SIZE, SIZE, 3), batch_size=1, name="image")
    features = keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="relu", name="colour")(inputs)
    scores = keras.layers.Conv2D(len(LABELS), 1, name="scores")(features)
    upsampled = keras.layers.Resizing(SIZE, SIZE, interpolation="bilinear", name="upsample")(scores)
    model = keras.Model(inputs, ArgMax(name="class_map")(upsampled))
    # colour: feature c = 1 + channel c's mean over the 3x3 patch (the input is (pixel - 127.5) / 127.5)
    kernel = np.zeros((3, 3, 3, 3), np.float32)
    for c in range(3):
        kernel[:, :, c, c] = 1 / 9
    model.get_layer("colour").set_weights([kernel, np.ones(3, np.float32)])
    # scores: background a constant 1; red 2r - g - b; green 2g - r - b
    weights = np.array([[0, 2, -1], [0, -1, 2], [0, -1, -1]], np.float32)[None, None]
    model.get_layer("scores").set_weights([weights, np.array([1, 0, 0], np.float32)])

    rng = np.random.default_rng(SEED)
    samples = [(drawing(rng)[0].astype(np.float32)[None] - MEAN) / STD for _ in range(CALIBRATION)]
    with tempfile.TemporaryDirectory() as tmp:
        saved = export_keras(model, Path(tmp))
        return quantize(saved, lambda: iter(samples), io_type="uint8")


def tiny_segmenter(size: int = 16) -> bytes:
    """The same colour rule as a few operators built as a flatbuffer (no TensorFlow, milliseconds): uint8 image
    (pixels as they are: scale 1/255) -> QUANTIZE -> CONV_2D 1x1 (background 0.5; red 2r - g - b; green 2g - r - b,
    with r, g, b in 0..1) -> ARG_MAX -> int64 [1, size, size]. For tests that need a segmenter served, not built."""
    from tests.tflite_builder import GraphBuilder

    g = GraphBuilder()
    image = g.tensor("image", [1, size, size, 3], "UINT8", scale=1 / 255, zero_point=0)
    x = g.tensor("image/int8", [1, size, size, 3], "INT8", scale=1 / 255, zero_point=-128)
    g.op("QUANTIZE", [image], [x])
    w_scale = 1 / 32
    weights = np.array([[0, 0, 0], [2, -1, -1], [-1, 2, -1]], np.float64).reshape(3, 1, 1, 3)
    w = g.tensor("scores/weights", [3, 1, 1, 3], "INT8", scale=[w_scale] * 3, zero_point=[0] * 3,
                 data=np.round(weights / w_scale))
    bias_scale = w_scale / 255
    b = g.tensor("scores/bias", [3], "INT32", scale=[bias_scale] * 3, zero_point=[0] * 3,
                 data=np.round(np.array([0.5, 0, 0]) / bias_scale))
    scores = g.tensor("scores", [1, size, size, 3], "INT8", scale=0.02, zero_point=0)
    g.op("CONV_2D", [x, w, b], [scores], padding="VALID", strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    out = g.tensor("ArgMax", [1, size, size], "INT64")
    g.op("ARG_MAX", [scores, g.constant("ArgMax/dimension", 3, shape=[])], [out], "ArgMaxOptions", outputType=4)
    return g.build([image], [out])
