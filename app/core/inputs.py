"""What enters the core: an encoded image (JPEG, PNG, ...: decoded and preprocessed as model.json says) or a raw
tensor already in the model's input form (no decoding, checked against the input's shape and dtype)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImageInput:
    """An encoded image, as a client sent it."""

    data: bytes


@dataclass(frozen=True)
class TensorInput:
    """The model's input tensor itself: [1, H, W, C] of its input dtype (OIP v2's tensors, Frigate's frames)."""

    tensor: np.ndarray


Given = ImageInput | TensorInput
