"""The architectures the Edge TPU estimate is calibrated on, built as Keras models without weights.

Latency does not depend on weight values, so each published measurement needs only its model's
structure: `python -m converter.calibrate_estimate features` builds each architecture here with
random weights, quantizes it with the converter's own path and records its features. Most come
from `keras.applications` (at the input size and width the measurement names); the ones it lacks
are written below from their papers, as Coral's files lay them out. Batch norm is left out: at
inference it folds into the convolution before it, so a convolution with a bias and its activation
gives the same int8 graph.

    ARCHITECTURES["InceptionV1"].build(keras, keras.Input((224, 224, 3), batch_size=1))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# TFLite_Detection_PostProcess as the TF object-detection exporter writes it for Coral's SSD files: 1917
# anchors at 300x300 (6 feature maps, 3 anchors per cell on the first, 6 on the others), 90 COCO classes
# plus background, 10 detections out.
SSD_CLASSES = 91
SSD_MAX_DETECTIONS = 10


@dataclass(frozen=True)
class Architecture:
    """How to build one calibration architecture, and the Edge TPU model's CPU tail when it has one."""

    build: Callable           # (keras, input_tensor) -> keras.Model
    input_size: int
    description: str
    # a detector ends in TFLite_Detection_PostProcess on the CPU: (anchors, classes with background); the
    # features get the op appended, since Keras cannot write the custom op (see calibrate_estimate)
    postprocess: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)


def keras_application(name: str, **kwargs) -> Callable:
    def build(keras, input_tensor):
        return getattr(keras.applications, name)(weights=None, input_tensor=input_tensor, classes=1000, **kwargs)

    return build


def _conv(keras, x, filters: int, kernel, strides: int = 1, padding: str = "same", activation="relu"):
    return keras.layers.Conv2D(filters, kernel, strides=strides, padding=padding, activation=activation)(x)


def _classifier(keras, x, classes: int = 1001):
    """Global average pool, then the logits and softmax, as the slim classifiers end."""
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.layers.Softmax()(keras.layers.Dense(classes)(x))


def squeezenet_1_0(keras, input_tensor, classes: int = 1000):
    """SqueezeNet 1.0 (Iandola et al. 2016, table 1).

    Version 1.0 rather than 1.1: Table 1's CPU columns put Coral's SqueezeNet above MobileNet v1 (0.57 G MACs)
    in work (232 against 164 ms on the embedded CPU), as 1.0's 0.86 G MACs are and 1.1's 0.35 are not.
    """
    layers = keras.layers

    def fire(x, squeeze: int, expand: int):
        x = _conv(keras, x, squeeze, 1)
        return layers.Concatenate()([_conv(keras, x, expand, 1), _conv(keras, x, expand, 3)])

    x = _conv(keras, input_tensor, 96, 7, strides=2, padding="valid")
    x = layers.MaxPooling2D(3, strides=2)(x)
    for squeeze, expand in ((16, 64), (16, 64), (32, 128)):
        x = fire(x, squeeze, expand)
    x = layers.MaxPooling2D(3, strides=2)(x)
    for squeeze, expand in ((32, 128), (48, 192), (48, 192), (64, 256)):
        x = fire(x, squeeze, expand)
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = fire(x, 64, 256)
    x = _conv(keras, x, classes, 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(input_tensor, layers.Softmax()(x))


# GoogLeNet's inception modules (Szegedy et al. 2014, table 1): #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5,
# pool proj. Coral's inception_v1_224_quant is the TF-slim model, whose "5x5" branch is a 3x3 convolution.
INCEPTION_V1_MODULES = {
    "3b": (64, 96, 128, 16, 32, 32), "3c": (128, 128, 192, 32, 96, 64),
    "4b": (192, 96, 208, 16, 48, 64), "4c": (160, 112, 224, 24, 64, 64), "4d": (128, 128, 256, 24, 64, 64),
    "4e": (112, 144, 288, 32, 64, 64), "4f": (256, 160, 320, 32, 128, 128),
    "5b": (256, 160, 320, 32, 128, 128), "5c": (384, 192, 384, 48, 128, 128),
}


def inception_v1(keras, input_tensor):
    """Inception v1 (GoogLeNet) at 224, as TF-slim's inception_v1 (Coral's inception_v1_224_quant)."""
    layers = keras.layers

    def module(x, name):
        b0, b1r, b1, b2r, b2, b3 = INCEPTION_V1_MODULES[name]
        pool = layers.MaxPooling2D(3, strides=1, padding="same")(x)
        return layers.Concatenate()([_conv(keras, x, b0, 1), _conv(keras, _conv(keras, x, b1r, 1), b1, 3),
                                     _conv(keras, _conv(keras, x, b2r, 1), b2, 3), _conv(keras, pool, b3, 1)])

    x = _conv(keras, input_tensor, 64, 7, strides=2)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = _conv(keras, _conv(keras, x, 64, 1), 192, 3)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for name in ("3b", "3c"):
        x = module(x, name)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for name in ("4b", "4c", "4d", "4e", "4f"):
        x = module(x, name)
    x = layers.MaxPooling2D(2, strides=2, padding="same")(x)
    for name in ("5b", "5c"):
        x = module(x, name)
    return keras.Model(input_tensor, _classifier(keras, x))


def inception_v4(keras, input_tensor):
    """Inception v4 at 299 (Szegedy et al. 2016, figures 3-9), without the auxiliary head inference drops."""
    layers = keras.layers
    conv = lambda x, f, k, s=1, p="same": _conv(keras, x, f, k, strides=s, padding=p)  # noqa: E731
    cat = lambda *xs: layers.Concatenate()(list(xs))  # noqa: E731
    avg = lambda x: layers.AveragePooling2D(3, strides=1, padding="same")(x)  # noqa: E731
    max_s2 = lambda x: layers.MaxPooling2D(3, strides=2, padding="valid")(x)  # noqa: E731

    x = conv(conv(conv(input_tensor, 32, 3, 2, "valid"), 32, 3, 1, "valid"), 64, 3)   # stem, figure 3
    x = cat(max_s2(x), conv(x, 96, 3, 2, "valid"))
    x = cat(conv(conv(x, 64, 1), 96, 3, 1, "valid"),
            conv(conv(conv(conv(x, 64, 1), 64, (1, 7)), 64, (7, 1)), 96, 3, 1, "valid"))
    x = cat(conv(x, 192, 3, 2, "valid"), max_s2(x))
    for _ in range(4):                                                                  # Inception-A, figure 4
        x = cat(conv(x, 96, 1), conv(conv(x, 64, 1), 96, 3), conv(conv(conv(x, 64, 1), 96, 3), 96, 3),
                conv(avg(x), 96, 1))
    x = cat(conv(x, 384, 3, 2, "valid"), conv(conv(conv(x, 192, 1), 224, 3), 256, 3, 2, "valid"), max_s2(x))
    for _ in range(7):                                                                  # Inception-B, figure 5
        b2 = conv(conv(conv(conv(conv(x, 192, 1), 192, (7, 1)), 224, (1, 7)), 224, (7, 1)), 256, (1, 7))
        x = cat(conv(x, 384, 1), conv(conv(conv(x, 192, 1), 224, (1, 7)), 256, (7, 1)), b2, conv(avg(x), 128, 1))
    x = cat(conv(conv(x, 192, 1), 192, 3, 2, "valid"),                                  # Reduction-B, figure 8
            conv(conv(conv(conv(x, 256, 1), 256, (1, 7)), 320, (7, 1)), 320, 3, 2, "valid"), max_s2(x))
    for _ in range(3):                                                                  # Inception-C, figure 6
        b1 = conv(x, 384, 1)
        b2 = conv(conv(conv(x, 384, 1), 448, (3, 1)), 512, (1, 3))
        x = cat(conv(x, 256, 1), conv(b1, 256, (1, 3)), conv(b1, 256, (3, 1)), conv(b2, 256, (1, 3)),
                conv(b2, 256, (3, 1)), conv(avg(x), 256, 1))
    return keras.Model(input_tensor, _classifier(keras, x))


# EfficientNet-EdgeTPU (Gupta and Tan 2019; tensorflow/tpu models/official/efficientnet/edgetpu): stages of
# (repeats, kernel, stride, expansion, in, out, fused), ReLU, no squeeze-excitation. A fused block expands
# with a full kxk convolution instead of 1x1 + depthwise. Sizes: (width, depth, resolution).
EFFICIENTNET_EDGETPU_STAGES = ((1, 3, 1, 4, 24, 24, True), (2, 3, 2, 8, 24, 32, True), (4, 3, 2, 8, 32, 48, True),
                               (5, 5, 2, 8, 48, 96, False), (4, 5, 1, 8, 96, 144, False),
                               (2, 5, 2, 8, 144, 192, False))
EFFICIENTNET_EDGETPU_SIZES = {"S": (1.0, 1.0, 224), "M": (1.0, 1.1, 240), "L": (1.2, 1.4, 300)}


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """EfficientNet's channel rounding: scale, round to a multiple of 8, never below 90% of the scaled value."""
    filters *= width
    rounded = max(divisor, int(filters + divisor / 2) // divisor * divisor)
    return int(rounded + divisor if rounded < 0.9 * filters else rounded)


def efficientnet_edgetpu(size: str) -> Callable:
    width, depth, _ = EFFICIENTNET_EDGETPU_SIZES[size]

    def build(keras, input_tensor):
        layers = keras.layers
        x = _conv(keras, input_tensor, _round_filters(32, width), 3, strides=2)
        for stage, (repeats, kernel, stride, expand, cin, cout, fused) in enumerate(EFFICIENTNET_EDGETPU_STAGES):
            cin, cout = _round_filters(cin, width), _round_filters(cout, width)
            for i in range(int(math.ceil(depth * repeats))):
                s, channels_in = (stride, cin) if i == 0 else (1, cout)
                if fused:
                    y = _conv(keras, x, channels_in * expand, kernel, strides=s)
                else:
                    y = layers.DepthwiseConv2D(kernel, strides=s, padding="same", activation="relu")(
                        _conv(keras, x, channels_in * expand, 1))
                y = _conv(keras, y, cout, 1, activation=None)
                # the first stage's block is marked noskip in the block arguments
                skip = s == 1 and channels_in == cout and stage > 0
                x = layers.Add()([x, y]) if skip else y
        x = _conv(keras, x, _round_filters(1280, width), 1)
        return keras.Model(input_tensor, _classifier(keras, x))

    return build


def ssd_head(keras, taps, classes: int = SSD_CLASSES):
    """The SSD extra feature maps and box predictor of TF object detection's ssd_mobilenet_v{1,2} configs.

    Four extra maps (depths 512, 256, 256, 128), each a 1x1 convolution at half depth then a 3x3 stride-2
    convolution; on each of the six maps a 1x1 box convolution (4 per anchor) and a 1x1 class convolution
    (91 per anchor), 3 anchors per cell on the first map and 6 on the others; boxes and classes concatenated
    over the maps, the class scores through a sigmoid. 300x300 gives 19x19, 10x10, 5x5, 3x3, 2x2 and 1x1 maps:
    1917 anchors.
    """
    layers = keras.layers
    maps = list(taps)
    x = taps[-1]
    for depth in (512, 256, 256, 128):
        x = _conv(keras, _conv(keras, x, depth // 2, 1, activation="relu6"), depth, 3, strides=2,
                  activation="relu6")
        maps.append(x)
    boxes, scores = [], []
    for i, feature_map in enumerate(maps):
        anchors = 3 if i == 0 else 6
        cells = feature_map.shape[1] * feature_map.shape[2]
        boxes.append(layers.Reshape((cells * anchors, 4))(_conv(keras, feature_map, anchors * 4, 1, activation=None)))
        scores.append(layers.Reshape((cells * anchors, classes))(
            _conv(keras, feature_map, anchors * classes, 1, activation=None)))
    return [layers.Concatenate(axis=1)(boxes), layers.Activation("sigmoid")(layers.Concatenate(axis=1)(scores))]


# MobileNet v1 (Howard et al. 2017, table 1) after its first convolution: (depthwise stride, pointwise channels)
MOBILENET_V1_BLOCKS = ((1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512), (1, 512), (1, 512), (1, 512),
                       (1, 512), (1, 512), (2, 1024), (1, 1024))


def ssd_mobilenet_v1(keras, input_tensor):
    """SSD MobileNet v1 COCO at 300: the pointwise outputs of blocks 11 and 13 (19x19x512, 10x10x1024) feed the
    head. The backbone is written out with TF's "same" padding, as the object-detection API builds it:
    keras.applications' MobileNet pads for even sizes and would give 18x18 and 9x9 maps at 300."""
    x = _conv(keras, input_tensor, 32, 3, strides=2, activation="relu6")
    taps = []
    for i, (stride, channels) in enumerate(MOBILENET_V1_BLOCKS, start=1):
        x = keras.layers.DepthwiseConv2D(3, strides=stride, padding="same", activation="relu6")(x)
        x = _conv(keras, x, channels, 1, activation="relu6")
        if i in (11, 13):
            taps.append(x)
    return keras.Model(input_tensor, ssd_head(keras, taps))


def ssd_mobilenet_v2(keras, input_tensor):
    """SSD MobileNet v2 COCO at 300: the expansion of slim's layer_15 (keras block_13) and the 1280-channel
    last layer feed the head."""
    backbone = keras.applications.MobileNetV2(weights=None, include_top=False, input_tensor=input_tensor)
    taps = [backbone.get_layer(name).output for name in ("block_13_expand_relu", "out_relu")]
    return keras.Model(input_tensor, ssd_head(keras, taps))


def rock_paper_scissors_cnn(keras, input_tensor):
    """The small CNN of EscVM/RPS_with_Edge_TPU (its training notebook): four 3x3 convolutions with 2x2 max
    pooling, a 512-unit dense layer and 3 classes, at 150x150."""
    layers = keras.layers
    x = input_tensor
    for filters in (64, 64, 128, 128):
        x = layers.MaxPooling2D(2, 2)(_conv(keras, x, filters, 3, padding="valid"))
    x = layers.Dense(512, activation="relu")(layers.Flatten()(x))
    return keras.Model(input_tensor, layers.Dense(3, activation="softmax")(x))


def _keras(name: str, size: int, **kwargs) -> Architecture:
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return Architecture(keras_application(name, **kwargs), size, f"keras.applications.{name}({args}) at {size}")


ARCHITECTURES: dict[str, Architecture] = {
    "DenseNet121": _keras("DenseNet121", 224),
    "InceptionResNetV2": _keras("InceptionResNetV2", 299),
    "InceptionV3": _keras("InceptionV3", 299),
    "MobileNet": _keras("MobileNet", 224),
    "MobileNet_0.75_192": _keras("MobileNet", 192, alpha=0.75),
    "MobileNet_0.5_160": _keras("MobileNet", 160, alpha=0.5),
    "MobileNet_0.25_128": _keras("MobileNet", 128, alpha=0.25),
    "MobileNetV2": _keras("MobileNetV2", 224),
    "ResNet50": _keras("ResNet50", 299),
    "ResNet50V2": _keras("ResNet50V2", 299),
    "ResNet152V2": _keras("ResNet152V2", 299),
    "VGG16": _keras("VGG16", 224),
    "VGG19": _keras("VGG19", 224),
    "SqueezeNet10": Architecture(squeezenet_1_0, 224, "SqueezeNet 1.0 from its paper"),
    "InceptionV1": Architecture(inception_v1, 224, "Inception v1 (GoogLeNet) from its paper, TF-slim layout"),
    "InceptionV4": Architecture(inception_v4, 299, "Inception v4 from its paper"),
    "EfficientNetEdgeTPU_S": Architecture(efficientnet_edgetpu("S"), 224, "EfficientNet-EdgeTPU-S from its builder"),
    "EfficientNetEdgeTPU_M": Architecture(efficientnet_edgetpu("M"), 240, "EfficientNet-EdgeTPU-M from its builder"),
    "EfficientNetEdgeTPU_L": Architecture(efficientnet_edgetpu("L"), 300, "EfficientNet-EdgeTPU-L from its builder"),
    "SSDMobileNetV1": Architecture(ssd_mobilenet_v1, 300, "SSD MobileNet v1 COCO (TF object detection) at 300",
                                   postprocess=(1917, SSD_CLASSES)),
    "SSDMobileNetV2": Architecture(ssd_mobilenet_v2, 300, "SSD MobileNet v2 COCO (TF object detection) at 300",
                                   postprocess=(1917, SSD_CLASSES)),
    "RockPaperScissorsCNN": Architecture(rock_paper_scissors_cnn, 150, "EscVM's rock-paper-scissors CNN"),
}
