"""A small pose model with MoveNet SinglePose's float tail, quantized by the project's converter.

    uint8 image [1, 64, 64, 3] -> CAST -> float (its own /255 inside, as MoveNet's normalization)
      -> CONV_2D 4x4 stride 4 (16x16 cells): keypoint heatmaps (17, LOGISTIC), a centre heatmap (LOGISTIC),
         regressions (34: each keypoint's displacement from the centre), offsets (34: sub-cell refinements)
      -> MoveNet's decoding: the centre = ARG_MAX of the centre heatmap weighted towards the image's middle,
         FLOOR_DIV and SUB to its row and column, GATHER_ND of the regressions there; every heatmap weighted
         by 1 / (SQRT(squared distance to its regressed keypoint) + 1.8) (DIV), ARG_MAX per keypoint,
         FLOOR_DIV, GATHER_ND of the offsets and of the scores at the peaks
      -> float32 [1, 1, 17, 3]: (y, x, score), normalized to the input

converter/quantize.py quantizes it with `float_tail`: every operator with an int8 kernel in int8, SQRT and
DIV left in float between QUANTIZE and DEQUANTIZE, the int32 index arithmetic as it is, the uint8 input
without quantization and the float32 output, as Coral's movenet_single_pose_*_ptq.tflite files are.

The weights are chosen, not trained: every heatmap is a cell's brightness, the regressions a fixed stick
figure around the centre (FIGURE, in cells). On a white disc on black, the centre is the disc and each
keypoint the disc's cell nearest its place in the figure: the keypoints follow the disc where it is drawn.

    model_bytes = build_pose_model()
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

SIZE = 64
STRIDE = 4
CELLS = SIZE // STRIDE
KEYPOINTS = 17
# each keypoint's displacement from the centre, (dy, dx) in cells: a small upright stick figure
FIGURE = np.array([
    (-3, 0), (-3.5, -0.5), (-3.5, 0.5), (-3.2, -1), (-3.2, 1),        # nose, eyes, ears
    (-2, -1.5), (-2, 1.5), (-0.5, -2), (-0.5, 2), (1, -2.2), (1, 2.2),  # shoulders, elbows, wrists
    (0.5, -1), (0.5, 1), (2, -1), (2, 1), (3.5, -1), (3.5, 1),          # hips, knees, ankles
], np.float32)
OFFSET = (0.25, -0.25)  # every keypoint's sub-cell offset, (dy, dx) in cells
GAIN = 5.0              # heatmap logit per unit of brightness (a white cell: sigmoid(5) = 0.993, a half-covered one 0.5)
CALIBRATION = 30
FLOAT_OPS = ("SQRT", "DIV")  # float in MoveNet's files (the converter then had no int8 kernel for them)
SEED = 0


def disc_image(width: int, height: int, cx: float, cy: float, radius: float) -> np.ndarray:
    """Black, with a white disc: what the pose model follows."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[(x + 0.5 - cx) ** 2 + (y + 0.5 - cy) ** 2 <= radius ** 2] = 255
    return pixels


def build_pose_model() -> bytes:
    from converter.quantize import import_tensorflow, quantize

    tf = import_tensorflow()
    kernel = np.zeros((STRIDE, STRIDE, 3, KEYPOINTS + 1 + 4 * KEYPOINTS), np.float32)
    bias = np.zeros(kernel.shape[-1], np.float32)
    taps = STRIDE * STRIDE * 3
    kernel[:, :, :, :KEYPOINTS + 1] = 2 * GAIN / taps  # heatmaps and centre: GAIN * (2 * brightness - 1)
    bias[:KEYPOINTS + 1] = -GAIN
    bias[KEYPOINTS + 1:KEYPOINTS + 1 + 2 * KEYPOINTS] = FIGURE.reshape(-1)
    bias[KEYPOINTS + 1 + 2 * KEYPOINTS:] = np.tile(OFFSET, KEYPOINTS)

    yy, xx = np.mgrid[0:CELLS, 0:CELLS].astype(np.float32)
    middle = (CELLS - 1) / 2
    prior = 1 / (np.sqrt((yy - middle) ** 2 + (xx - middle) ** 2) + 1.8)  # MoveNet's centre weighting

    class Movenetish(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, SIZE, SIZE, 3], tf.uint8, name="input")])
        def __call__(self, image):
            x = tf.cast(image, tf.float32) * 2 / 255 - 1  # the model's own normalization, as MoveNet's
            out = tf.nn.conv2d(x, kernel, strides=STRIDE, padding="VALID") + bias  # constants: frozen weights
            heat = tf.sigmoid(out[..., :KEYPOINTS])
            centre = tf.sigmoid(out[..., KEYPOINTS:KEYPOINTS + 1]) * prior[None, :, :, None]
            regress = out[..., KEYPOINTS + 1:KEYPOINTS + 1 + 2 * KEYPOINTS]
            offsets = out[..., KEYPOINTS + 1 + 2 * KEYPOINTS:]
            # the centre: its cell, then the regressions there
            at = tf.argmax(tf.reshape(centre, [1, CELLS * CELLS, 1]), axis=1, output_type=tf.int32)  # [1, 1]
            cy = at // CELLS
            cx = at - cy * CELLS
            where = tf.stack([tf.zeros([1], tf.int32), tf.reshape(cy, [1]), tf.reshape(cx, [1])], axis=1)
            shift = tf.reshape(tf.gather_nd(regress, where), [KEYPOINTS, 2])
            dy, dx = tf.unstack(shift, axis=1)
            ry = tf.cast(cy, tf.float32) + dy  # [1, 17]
            rx = tf.cast(cx, tf.float32) + dx
            # every heatmap weighted by the distance to its regressed keypoint
            distance = tf.sqrt((yy[:, :, None] - ry) ** 2 + (xx[:, :, None] - rx) ** 2)  # [16, 16, 17]
            weighted = heat / (distance + 1.8)
            peak = tf.argmax(tf.reshape(weighted, [1, CELLS * CELLS, KEYPOINTS]), axis=1, output_type=tf.int32)
            ky = peak // CELLS
            kx = peak - ky * CELLS
            cells = tf.stack([tf.zeros([KEYPOINTS], tf.int32), tf.reshape(ky, [-1]), tf.reshape(kx, [-1])], axis=1)
            own = tf.stack([tf.range(KEYPOINTS), tf.range(KEYPOINTS)], axis=1)
            fine = tf.gather_nd(tf.reshape(tf.gather_nd(offsets, cells), [KEYPOINTS, KEYPOINTS, 2]), own)
            oy, ox = tf.unstack(fine, axis=1)
            y = (tf.cast(tf.reshape(ky, [-1]), tf.float32) + oy) / CELLS
            x = (tf.cast(tf.reshape(kx, [-1]), tf.float32) + ox) / CELLS
            score = tf.gather_nd(heat, tf.concat([cells, tf.range(KEYPOINTS)[:, None]], axis=1))
            return tf.reshape(tf.stack([y, x, score], axis=1), [1, 1, KEYPOINTS, 3])

    rng = np.random.default_rng(SEED)
    samples = [disc_image(SIZE, SIZE, *rng.uniform(16, 48, 2), rng.uniform(6, 14))[None]
               for _ in range(CALIBRATION)]
    module = Movenetish()
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures=module.__call__)
        return quantize(Path(tmp), lambda: iter(samples), float_tail=True, float_ops=FLOAT_OPS)


def tiny_pose(size: int = 16, figure: np.ndarray | None = None) -> bytes:
    """A pose model whose keypoints are fixed (MoveNet's frame, no TensorFlow, milliseconds): a raw uint8 input ->
    CAST -> QUANTIZE -> CONV_2D over the whole image with zero weights, its bias the keypoints -> RESHAPE
    [1, 1, 17, 3] -> DEQUANTIZE -> float32. `figure`: [17, 3] (y, x, score) normalized (default: FIGURE around
    the middle, scores 0.2 .. 1). For tests that need a pose model served, not built."""
    from tests.tflite_builder import GraphBuilder

    if figure is None:
        figure = np.column_stack([0.5 + FIGURE[:, 0] / CELLS, 0.5 + FIGURE[:, 1] / CELLS,
                                  np.linspace(0.2, 1.0, KEYPOINTS)])
    channels = KEYPOINTS * 3
    out_scale, out_zero = 1 / 254, -127  # 0..1 in 254 steps
    g = GraphBuilder()
    image = g.tensor("input", [1, size, size, 3], "UINT8")
    cast = g.tensor("Cast", [1, size, size, 3], "FLOAT32")
    g.op("CAST", [image], [cast])
    x = g.tensor("quantized", [1, size, size, 3], "INT8", scale=1.0, zero_point=-128)
    g.op("QUANTIZE", [cast], [x])
    w = g.tensor("heads/weights", [channels, size, size, 3], "INT8", scale=[0.01] * channels,
                 zero_point=[0] * channels, data=np.zeros((channels, size, size, 3)))
    b = g.tensor("heads/bias", [channels], "INT32", scale=[0.01] * channels, zero_point=[0] * channels,
                 data=np.round(figure.reshape(-1) / 0.01))
    heads = g.tensor("heads", [1, 1, 1, channels], "INT8", scale=out_scale, zero_point=out_zero)
    g.op("CONV_2D", [x, w, b], [heads], padding="VALID", strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    keypoints = g.tensor("keypoints/int8", [1, 1, KEYPOINTS, 3], "INT8", scale=out_scale, zero_point=out_zero)
    g.op("RESHAPE", [heads, g.constant("shape", [1, 1, KEYPOINTS, 3])], [keypoints], newShape=[1, 1, KEYPOINTS, 3])
    out = g.tensor("keypoints", [1, 1, KEYPOINTS, 3], "FLOAT32")
    g.op("DEQUANTIZE", [keypoints], [out])
    return g.build([image], [out])
