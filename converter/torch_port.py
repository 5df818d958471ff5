"""PyTorch weights into Keras layers: the route from a PyTorch model to an Edge TPU clean int8 graph.

There is no generic PyTorch -> TFLite converter in this project. Bridges exist (ONNX with onnx2tf,
Google's ai-edge-torch), but a traced PyTorch graph is NCHW: it reaches TFLite with TRANSPOSE
ops around the convolutions, or padding as separate PAD ops, and TRANSPOSE is not an Edge TPU
operation (everything after the first one runs on the CPU). The route taken here, as
converter/efficientnet_lite0.py does for its checkpoint:

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
