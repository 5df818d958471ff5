"""Small models shaped like the families Coral owners bring, converted as their exporters convert them.

Each builder returns the .tflite bytes of a Keras (or PyTorch) model whose graph has the operators of its
family, with random weights (seeded), calibrated on random images:

- ssd_tf2():            a TF2 Object Detection API SSD with an FPN, whose nearest-neighbour upsampling is
                        object_detection.utils.ops' `tf.stack` trick (PACK, RESHAPE), class scores through a
                        sigmoid, and TFLite_Detection_PostProcess as the exporter writes it (a tf.function
                        with `experimental_implements`); outputs listed in TF2's order: scores, boxes, count,
                        classes.
- yolo_ultralytics():   Ultralytics' single output [1, 4 + C, N]: DFL softmax over 16 bins, anchors and
                        strides, sigmoid classes, a TRANSPOSE; SiLU (LOGISTIC * x) or HARD_SWISH; SPPF
                        (MAX_POOL_2D), nearest-neighbour upsampling, C2f-style SPLIT, SPLIT_V of boxes and
                        classes, PAD before stride-2 convolutions.
- yolo11(form):         yolo_ultralytics with YOLO11's C2PSA attention after SPPF (tests/emulator_yolo11.py), converted
                        as onnx2tf converts Ultralytics' exports: full-integer, per-tensor, int8 in and out; its two
                        products as BATCH_MATMUL of computed operands ("batched") or per head ("per_head": a
                        FULLY_CONNECTED whose filter is the softmax).
- yolo_frigate():       the Coral layout Frigate decodes: ReLU6, class logits [1, N, C] and DFL [1, N, 64].
- yolo_torch():         the Ultralytics head written in PyTorch, through the project's torch route
                        (litert-torch + ai-edge-quantizer), int8 I/O.
- segmenter():          DeepLab v3 in small: depthwise convolutions, a residual ADD, image pooling
                        (AVERAGE_POOL_2D, RESIZE_BILINEAR), CONCATENATION, and ARG_MAX to an int64 class map.
- pose():               MoveNet's shape: an int8 body, then its keypoint decoding in float32 (DEQUANTIZE,
                        LOGISTIC, the centre's ARG_MAX, FLOOR_DIV, PACK and GATHER_ND to read the regression,
                        UNPACK, CAST, SQRT and DIV for the distance-weighted heatmap, a second ARG_MAX and
                        GATHER_ND for offsets and scores) to a float32 [1, 1, K, 3].

The TensorFlow conversions take 3-5 s each; tests cache them in session fixtures.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

SEED = 5
# Fixed: calibration images per model (random uniform pixels, as the float model expects them).
CALIBRATION_SAMPLES = 16


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    return tf, keras


def _calibration(size: int, low: float = -1.0, high: float = 1.0):
    """representative(): float32 (1, size, size, 3) images, as converter/quantize.py takes them."""
    rng = np.random.default_rng(SEED)
    return lambda: (rng.uniform(low, high, (1, size, size, 3)).astype(np.float32) for _ in range(CALIBRATION_SAMPLES))


def _as_lists(representative):
    """TF's converter wants each sample as a list of its inputs."""
    return lambda: ([sample] for sample in representative())


def _convert(converter, size: int, low: float = -1.0, high: float = 1.0, float_ops=()) -> bytes:
    """Full-integer PTQ with a uint8 input. float_ops: operators left in float32 (QuantizationDebugger's deny
    list), as MoveNet's float tail is: TF 2.21 would otherwise quantize SQRT, DIV and the rest."""
    tf, _ = _tf()
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = _as_lists(_calibration(size, low, high))
    converter.inference_input_type = tf.uint8
    if not float_ops:
        return bytes(converter.convert())
    options = tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=list(float_ops))
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=converter, debug_dataset=_as_lists(_calibration(size, low, high)), debug_options=options)
    return bytes(debugger.get_nondebug_quantized_model())


def _from_keras(model, size: int, low: float = -1.0, high: float = 1.0, integer_only: bool = True,
                float_ops=()) -> bytes:
    """Through the project's converter (converter/quantize.py) where the graph is all integer, else TF's own."""
    from converter.quantize import export_keras, quantize

    with tempfile.TemporaryDirectory() as workdir:
        saved_model = export_keras(model, Path(workdir))
        if integer_only:
            return quantize(saved_model, _calibration(size, low, high), "uint8")
        tf, _ = _tf()
        return _convert(tf.lite.TFLiteConverter.from_saved_model(str(saved_model)), size, low, high, float_ops)


# ---- TF2 Object Detection API SSD ----

SSD_SIZE = 64
SSD_CLASSES = 3
SSD_OPTIONS = dict(max_detections=10, max_classes_per_detection=1, detections_per_class=100, use_regular_nms=False,
                   nms_score_threshold=0.3, nms_iou_threshold=0.6, num_classes=SSD_CLASSES, y_scale=10.0,
                   x_scale=10.0, h_scale=5.0, w_scale=5.0)


def ssd_anchors() -> np.ndarray:
    """Two anchors per cell on a 16x16 and an 8x8 grid, as [ycenter, xcenter, h, w] normalized."""
    parts = []
    for cells, sizes in ((16, [[0.15, 0.15], [0.2, 0.1]]), (8, [[0.3, 0.3], [0.4, 0.2]])):
        centers = (np.arange(cells) + 0.5) / cells
        grid = np.stack(np.meshgrid(centers, centers, indexing="ij"), -1).reshape(-1, 1, 2).repeat(2, axis=1)
        parts.append(np.concatenate([grid, np.broadcast_to(sizes, grid.shape)], -1).reshape(-1, 4))
    return np.concatenate(parts).astype(np.float32)


def _implements(options: dict) -> str:
    """export_tflite_graph_tf2's signature string: the converter turns the function into the custom op."""
    attributes = ['name: "TFLite_Detection_PostProcess"']
    for key, value in options.items():
        kind = "b" if isinstance(value, bool) else "i" if isinstance(value, int) else "f"
        text = str(value).lower() if isinstance(value, bool) else value
        attributes.append(f'attr {{ key: "{key}" value {{ {kind}: {text} }} }}')
    attributes.append('attr { key: "_output_quantized" value { b: true } }')
    attributes.append('attr { key: "_support_output_type_float_in_quantized_op" value { b: true } }')
    return " ".join(attributes)


def in_tf2_order(model: bytes) -> bytes:
    """The graph's outputs listed scores, boxes, count, classes (StatefulPartitionedCall:1,3,0,2 in TF2 exports)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    from app.detection_postprocess import outputs_by_role
    from app.tflite_file import read_tflite

    roles = outputs_by_role(read_tflite(model).graph)
    parsed = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(model, 0))
    parsed.subgraphs[0].outputs = [roles[role].index for role in ("scores", "boxes", "count", "classes")]
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(parsed.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def ssd_tf2() -> bytes:
    tf, keras = _tf()
    from keras import layers

    image = keras.Input((SSD_SIZE, SSD_SIZE, 3), batch_size=1)
    c1 = layers.Conv2D(8, 3, 2, "same", activation="relu6")(image)
    c2 = layers.Conv2D(16, 3, 2, "same", activation="relu6")(c1)  # 16x16
    c3 = layers.Conv2D(16, 3, 2, "same", activation="relu6")(c2)  # 8x8
    backbone = keras.Model(image, [c2, c3])
    lateral = layers.Conv2D(16, 1)
    heads = [(layers.Conv2D(2 * 4, 3, padding="same"), layers.Conv2D(2 * (SSD_CLASSES + 1), 3, padding="same"))
             for _ in range(2)]
    parts = [backbone, lateral, *[layer for pair in heads for layer in pair]]
    backbone(np.zeros((1, SSD_SIZE, SSD_SIZE, 3), np.float32))
    for layer in parts[1:]:
        layer.build((1, 16, 16, 16))
    anchors = ssd_anchors()

    def nearest_neighbor_upsampling(x):
        """object_detection.utils.ops.nearest_neighbor_upsampling: stack, stack, reshape."""
        batch, height, width, channels = x.shape
        out = tf.stack([x] * 2, axis=3)
        out = tf.stack([out] * 2, axis=2)
        return tf.reshape(out, [batch, height * 2, width * 2, channels])

    class Detector(tf.Module):
        def __init__(self):
            super().__init__()
            self.tracked = [w.value for part in parts for w in part.weights]  # tracked: frozen by the converter

        @tf.function(experimental_implements=_implements(SSD_OPTIONS))
        def postprocess(self, box_encodings, class_predictions, anchor_boxes):
            zero = tf.constant(0.0, tf.float32)
            return zero, zero, zero, zero

        @tf.function(input_signature=[tf.TensorSpec([1, SSD_SIZE, SSD_SIZE, 3], tf.float32)])
        def __call__(self, pixels):
            fine, coarse = backbone(pixels)
            fine = lateral(fine) + nearest_neighbor_upsampling(coarse)
            boxes, logits = [], []
            for feature, (box_head, class_head) in zip((fine, coarse), heads, strict=True):
                boxes.append(tf.reshape(box_head(feature), [1, -1, 4]))
                logits.append(tf.reshape(class_head(feature), [1, -1, SSD_CLASSES + 1]))
            scores = tf.sigmoid(tf.concat(logits, 1))
            detected = self.postprocess(tf.concat(boxes, 1), scores, tf.constant(anchors))
            return dict(zip(("detection_boxes", "detection_classes", "detection_scores", "num_detections"),
                            detected, strict=True))

    detector = Detector()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([detector.__call__.get_concrete_function()], detector)
    converter.allow_custom_ops = True
    return in_tf2_order(_convert(converter, SSD_SIZE))


# ---- YOLO ----

YOLO_SIZE = 64
YOLO_CLASSES = 3
REG_MAX = 16
# YOLO11's C2PSA in small: yolo11n's has 2 heads of key_dim 32 and head_dim 64 over 256 channels
YOLO11_HEADS, YOLO11_KEY_DIM, YOLO11_HEAD_DIM = 2, 4, 8


def _yolo_backbone(image, activation: str, upsample: str, attention: str | None = None):
    """Conv + activation blocks, a C2f-style split, SPPF, an upsampled path; returns [(feature, stride)].
    attention: a C2PSA block after SPPF, as YOLO11 has it, in that form (tests/emulator_yolo11.py)."""
    tf, keras = _tf()
    from keras import layers

    def act(x):
        if activation == "silu":
            return layers.Multiply()([x, layers.Activation("sigmoid")(x)])
        if activation == "hard_swish":
            return layers.Activation("hard_swish")(x)
        return layers.ReLU(6.0)(x)

    def conv(x, channels, kernel=3, stride=1):
        if stride == 2 and activation != "relu6":  # Ultralytics' symmetric padding, as PAD + VALID
            return act(layers.Conv2D(channels, kernel, 2, "valid")(layers.ZeroPadding2D(((1, 0), (1, 0)))(x)))
        return act(layers.Conv2D(channels, kernel, stride, "same")(x))

    c3 = conv(conv(conv(image, 8, stride=2), 16, stride=2), 16, stride=2)  # stride 8
    first, second = layers.Lambda(lambda t: tf.split(t, 2, axis=-1))(c3)  # C2f: SPLIT
    c3 = layers.Concatenate()([first, conv(second, 8), second])
    c4 = conv(c3, 16, stride=2)  # stride 16
    pooled = [c4]
    for _ in range(3):  # SPPF
        pooled.append(layers.MaxPooling2D(5, 1, "same")(pooled[-1]))
    c4 = conv(layers.Concatenate()(pooled), 16, 1)
    if attention is not None:
        from tests.emulator_yolo11 import c2psa

        c4 = c2psa(c4, 16, heads=YOLO11_HEADS, key_dim=YOLO11_KEY_DIM, head_dim=YOLO11_HEAD_DIM, form=attention)
    if upsample == "resize":
        up = layers.Lambda(lambda t: tf.image.resize(t, (t.shape[1] * 2, t.shape[2] * 2), method="nearest"))(c4)
    else:
        up = layers.UpSampling2D(2)(c4)
    p3 = conv(layers.Concatenate()([up, c3]), 16)
    return [(p3, 8), (c4, 16)], conv


def _grid(features) -> tuple[np.ndarray, np.ndarray]:
    """Anchor centres (cell + 0.5, x then y) and strides for each level's cells, in row-major order."""
    anchors, strides = [], []
    for feature, stride in features:
        cells = feature.shape[1]
        ys, xs = np.meshgrid(np.arange(cells) + 0.5, np.arange(cells) + 0.5, indexing="ij")
        anchors.append(np.stack([xs, ys], -1).reshape(-1, 2))
        strides.append(np.full((cells * cells, 1), stride))
    return np.concatenate(anchors)[None].astype(np.float32), np.concatenate(strides)[None].astype(np.float32)


def yolo_ultralytics(activation: str = "silu", attention: str | None = None) -> bytes:
    """[1, 4 + C, N]: xywh in input pixels, then sigmoid class scores. attention: YOLO11's C2PSA after SPPF, and
    the conversion onnx2tf makes of Ultralytics' exports (_onnx2tf_like)."""
    tf, keras = _tf()
    from keras import layers

    image = keras.Input((YOLO_SIZE, YOLO_SIZE, 3), batch_size=1)
    features, conv = _yolo_backbone(image, activation, "resize", attention)
    rows = [layers.Reshape((f.shape[1] ** 2, 4 * REG_MAX + YOLO_CLASSES))(
        layers.Conv2D(4 * REG_MAX + YOLO_CLASSES, 1)(conv(f, 16))) for f, _ in features]
    anchors, strides = _grid(features)
    count = anchors.shape[1]

    def decode(x):
        box, cls = tf.split(x, [4 * REG_MAX, YOLO_CLASSES], axis=-1)  # SPLIT_V
        distances = tf.nn.softmax(tf.reshape(box, [1, count, 4, REG_MAX]), axis=-1)  # DFL
        distances = tf.reduce_sum(distances * tf.range(REG_MAX, dtype=tf.float32), axis=-1)
        left_top, right_bottom = tf.split(distances, 2, axis=-1)
        x1y1, x2y2 = anchors - left_top, anchors + right_bottom
        xywh = tf.concat([(x1y1 + x2y2) * 0.5, x2y2 - x1y1], -1) * strides
        return tf.transpose(tf.concat([xywh, tf.sigmoid(cls)], -1), [0, 2, 1])

    out = layers.Lambda(decode)(layers.Concatenate(axis=1)(rows))
    if attention is not None:
        return _onnx2tf_like(keras.Model(image, out), YOLO_SIZE)
    return _from_keras(keras.Model(image, out), YOLO_SIZE, 0.0, 1.0)


def yolo11(form: str = "batched") -> bytes:
    return yolo_ultralytics("silu", attention=form)


def _onnx2tf_like(model, size: int) -> bytes:
    """Full-integer PTQ as onnx2tf runs it for Ultralytics (quant_type "per-tensor", int8 in and out, integer
    kernels only), calibrated on pixels / 255."""
    from converter.quantize import export_keras

    tf, _ = _tf()
    with tempfile.TemporaryDirectory() as workdir:
        converter = tf.lite.TFLiteConverter.from_saved_model(str(export_keras(model, Path(workdir))))
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _as_lists(_calibration(size, 0.0, 1.0))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
        converter._experimental_disable_per_channel = True  # noqa: SLF001 (onnx2tf's per-tensor switch)
        return bytes(converter.convert())


def yolo_frigate() -> bytes:
    """Frigate's Coral layout: ReLU6, class logits [1, N, C] and DFL distributions [1, N, 64]."""
    tf, keras = _tf()
    from keras import layers

    image = keras.Input((YOLO_SIZE, YOLO_SIZE, 3), batch_size=1)
    features, conv = _yolo_backbone(image, "relu6", "resize")
    boxes = [layers.Reshape((f.shape[1] ** 2, 4 * REG_MAX))(layers.Conv2D(4 * REG_MAX, 1)(conv(f, 16)))
             for f, _ in features]
    classes = [layers.Reshape((f.shape[1] ** 2, YOLO_CLASSES))(layers.Conv2D(YOLO_CLASSES, 1)(conv(f, 16)))
               for f, _ in features]
    outputs = [layers.Concatenate(axis=1)(classes), layers.Concatenate(axis=1)(boxes)]
    return _from_keras(keras.Model(image, outputs), YOLO_SIZE, 0.0, 1.0)


def yolo_torch() -> bytes:
    """The Ultralytics head (DFL as a fixed 1x1 convolution, dist2bbox, SiLU) through converter/torch_route.py."""
    import torch
    from torch import nn

    from converter.torch_route import float_tflite, quantize_tflite

    torch.manual_seed(SEED)

    class Conv(nn.Module):
        def __init__(self, a, b, kernel=3, stride=1):
            super().__init__()
            self.conv, self.act = nn.Conv2d(a, b, kernel, stride, kernel // 2), nn.SiLU()

        def forward(self, x):
            return self.act(self.conv(x))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(Conv(3, 8, 3, 2), Conv(8, 16, 3, 2), Conv(16, 16, 3, 2))
            self.down, self.pool = Conv(16, 16, 3, 2), nn.MaxPool2d(5, 1, 2)
            self.up, self.merge = nn.Upsample(scale_factor=2, mode="nearest"), Conv(32, 16)
            self.out = nn.ModuleList(nn.Conv2d(16, 4 * REG_MAX + YOLO_CLASSES, 1) for _ in range(2))
            self.dfl = nn.Conv2d(REG_MAX, 1, 1, bias=False)
            self.dfl.weight.data[:] = torch.arange(REG_MAX, dtype=torch.float).view(1, REG_MAX, 1, 1)
            anchors, strides = [], []
            for cells, stride in ((8, 8), (4, 16)):
                ys, xs = torch.meshgrid(torch.arange(cells) + 0.5, torch.arange(cells) + 0.5, indexing="ij")
                anchors.append(torch.stack((xs, ys), -1).view(-1, 2))
                strides.append(torch.full((cells * cells, 1), float(stride)))
            self.register_buffer("anchors", torch.cat(anchors).transpose(0, 1)[None])
            self.register_buffer("strides", torch.cat(strides).transpose(0, 1)[None])

        def forward(self, x):
            c3 = self.stem(x)
            c4 = self.down(c3)
            pooled = [c4]
            for _ in range(3):
                pooled.append(self.pool(pooled[-1]))
            c4 = c4 + pooled[-1]
            p3 = self.merge(torch.cat([self.up(c4), c3], 1))
            x = torch.cat([head(f).view(1, 4 * REG_MAX + YOLO_CLASSES, -1)
                           for head, f in zip(self.out, (p3, c4), strict=True)], 2)
            box, cls = x.split((4 * REG_MAX, YOLO_CLASSES), 1)
            count = box.shape[2]
            d = self.dfl(box.view(1, 4, REG_MAX, count).transpose(2, 1).softmax(1)).view(1, 4, count)
            left_top, right_bottom = d.chunk(2, 1)
            x1y1, x2y2 = self.anchors - left_top, self.anchors + right_bottom
            xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
            return torch.cat((xywh, cls.sigmoid()), 1)

    float_model = float_tflite(Head().eval(), YOLO_SIZE, YOLO_SIZE, 3)
    return quantize_tflite(float_model, _calibration(YOLO_SIZE, 0.0, 1.0)())


# ---- segmentation and pose ----

SEGMENTER_SIZE = 33
SEGMENTER_CLASSES = 5


def segmenter() -> bytes:
    """DeepLab v3 in small, ending as Coral's does: RESIZE_BILINEAR (align_corners) to the input size, ARG_MAX int64."""
    tf, keras = _tf()
    from keras import layers

    size = SEGMENTER_SIZE
    image = keras.Input((size, size, 3), batch_size=1)
    x = layers.Conv2D(8, 3, 2, "same", activation="relu6")(image)
    x = layers.DepthwiseConv2D(3, 1, "same", activation="relu6")(x)
    x = layers.Conv2D(16, 1, activation="relu6")(x)
    x = layers.Conv2D(16, 3, 2, "same", activation="relu6")(x)  # a quarter of the input's side
    x = layers.Add()([x, layers.Conv2D(16, 1)(x)])
    pooled = layers.Conv2D(8, 1, activation="relu")(layers.AveragePooling2D(x.shape[1])(x))  # image pooling
    cells = x.shape[1]
    pooled = layers.Lambda(lambda t: tf.image.resize(t, (cells, cells), method="bilinear"))(pooled)
    features = layers.Concatenate()([pooled, layers.Conv2D(8, 1, activation="relu")(x)])
    logits = layers.Conv2D(SEGMENTER_CLASSES, 1)(features)
    logits = layers.Lambda(lambda t: tf.compat.v1.image.resize_bilinear(t, (size, size), align_corners=True))(logits)
    classes = layers.Lambda(lambda t: tf.argmax(t, axis=-1, output_type=tf.int64))(logits)
    return _from_keras(keras.Model(image, classes), size)


POSE_SIZE = 48
POSE_GRID = 12
POSE_KEYPOINTS = 5
# What MoveNet's file keeps in float32 after its integer body (Coral's movenet_single_pose_*_ptq.tflite).
POSE_FLOAT_OPS = ("LOGISTIC", "MUL", "ADD", "SUB", "DIV", "SQRT", "RESHAPE", "TRANSPOSE", "STRIDED_SLICE", "PACK",
                  "UNPACK", "GATHER_ND", "ARG_MAX", "FLOOR_DIV", "CAST", "CONCATENATION")


def pose(float_ops=POSE_FLOAT_OPS) -> bytes:
    """MoveNet single pose in small: heatmaps, centre, regression and offsets from an int8 body, then MoveNet's
    decoding in float32 to [1, 1, K, 3] (y, x, score), normalized. float_ops=() quantizes what TF can (DIV,
    SQRT, MUL ... in int8): what a user's own conversion with TF 2.21 gives."""
    tf, keras = _tf()
    from keras import layers

    grid, k = POSE_GRID, POSE_KEYPOINTS
    image = keras.Input((POSE_SIZE, POSE_SIZE, 3), batch_size=1)
    x = layers.Conv2D(8, 3, 2, "same", activation="relu6")(image)
    x = layers.Conv2D(16, 3, 2, "same", activation="relu6")(x)
    heatmaps = layers.Conv2D(k, 1)(x)
    center = layers.Conv2D(1, 1)(x)
    regression = layers.Conv2D(2 * k, 1)(x)
    offsets = layers.Conv2D(2 * k, 1)(x)
    ys, xs = np.meshgrid(np.arange(grid, dtype=np.float32), np.arange(grid, dtype=np.float32), indexing="ij")
    prior = (1.0 / (1.0 + np.hypot(ys - grid / 2, xs - grid / 2)))[None, :, :, None].astype(np.float32)

    def decode(tensors):
        heatmaps, center, regression, offsets = tensors
        heatmaps, center = tf.sigmoid(heatmaps), tf.sigmoid(center)
        index = tf.argmax(tf.reshape(center * prior, [1, -1]), axis=-1, output_type=tf.int32)[0]
        cy = tf.math.floordiv(index, grid)
        cx = index - cy * grid
        regressed = tf.reshape(tf.gather_nd(regression[0], tf.stack([cy, cx])), [k, 2])
        ry, rx = tf.unstack(regressed, axis=-1)
        ky, kx = tf.cast(cy, tf.float32) + ry, tf.cast(cx, tf.float32) + rx
        dy, dx = ys[None] - ky[:, None, None], xs[None] - kx[:, None, None]
        weighted = tf.transpose(heatmaps[0], [2, 0, 1]) / (tf.sqrt(dy * dy + dx * dx) + 1.8)
        best = tf.argmax(tf.reshape(weighted, [k, -1]), axis=-1, output_type=tf.int32)
        by = tf.math.floordiv(best, grid)
        bx = best - by * grid
        channel = tf.range(k)
        offset_y = tf.gather_nd(offsets[0], tf.stack([by, bx, 2 * channel], -1))
        offset_x = tf.gather_nd(offsets[0], tf.stack([by, bx, 2 * channel + 1], -1))
        score = tf.gather_nd(heatmaps[0], tf.stack([by, bx, channel], -1))
        y = (tf.cast(by, tf.float32) + offset_y) / grid
        x = (tf.cast(bx, tf.float32) + offset_x) / grid
        return tf.reshape(tf.stack([y, x, score], -1), [1, 1, k, 3])

    keypoints = layers.Lambda(decode)([heatmaps, center, regression, offsets])
    return _from_keras(keras.Model(image, keypoints), POSE_SIZE, integer_only=False, float_ops=float_ops)
