"""PyTorch weights into Keras layers: the hand-port route, kept for the committed EfficientNet-Lite0.

The generic route for PyTorch and ONNX models is converter/torch_route.py (`python -m converter
quantize model.pt2`): litert-torch makes the graph channel-last without TRANSPOSE ops and
ai-edge-quantizer quantizes it. Porting by hand stays useful when you want a uint8-input Keras
model (TFLiteConverter's uint8 I/O) or Keras-side control of the graph; EfficientNet-Lite0 was
built this way (converter/efficientnet_lite0.py), and the generic route gives the same operators:

  1. rebuild the architecture in Keras, NHWC, with a fixed batch of 1, and padding that matches
     (Keras padding="same" is TensorFlow's static "same": for stride 1 and an odd kernel it equals
     torch's padding=k//2; for stride 2 it pads asymmetrically, as TF-trained checkpoints expect);
  2. copy each tensor with the functions below, which only change the memory layout;
  3. check the two float models agree on real inputs, then `python -m converter quantize`
     the saved Keras model and `python -m converter inspect` the result.
"""

from __future__ import annotations

import numpy as np


def conv2d(weight: np.ndarray) -> np.ndarray:
    """nn.Conv2d weight (out, in, kh, kw) -> Keras Conv2D kernel (kh, kw, in, out)."""
    return np.asarray(weight).transpose(2, 3, 1, 0)


def depthwise_conv2d(weight: np.ndarray) -> np.ndarray:
    """nn.Conv2d(groups=channels) weight (channels * m, 1, kh, kw) -> DepthwiseConv2D kernel (kh, kw, channels, m)."""
    weight = np.asarray(weight)
    out_channels, _, kh, kw = weight.shape
    return weight.transpose(2, 3, 0, 1).reshape(kh, kw, out_channels, 1)


def linear(weight: np.ndarray) -> np.ndarray:
    """nn.Linear weight (out, in) -> Dense kernel (in, out)."""
    return np.asarray(weight).T


def linear_after_flatten(weight: np.ndarray, channels: int, height: int, width: int) -> np.ndarray:
    """The first nn.Linear after a flatten: torch flattens (C, H, W), Keras (H, W, C), so its inputs are reordered.

    Keras feature j = (h, w, c) in row-major order is torch feature c * H * W + h * W + w.
    """
    weight = np.asarray(weight)
    out_features = weight.shape[0]
    by_chw = weight.reshape(out_features, channels, height, width)
    return by_chw.transpose(0, 2, 3, 1).reshape(out_features, height * width * channels).T


def batch_norm(state: dict, prefix: str) -> list[np.ndarray]:
    """nn.BatchNorm2d -> BatchNormalization weights [gamma, beta, moving_mean, moving_variance].

    Keep torch's eps (1e-5 unless the model sets another) in the Keras layer: with the wrong
    eps, outputs drift (EfficientNet-Lite0's logits moved by up to 1.7).
    """
    return [np.asarray(state[f"{prefix}.{key}"]) for key in ("weight", "bias", "running_mean", "running_var")]
