"""The int8 models in this folder: small torch classifiers through the issue-14 converter route.

litert-torch 0.10.0 (`convert(to_channel_last_io(model), (nhwc_sample,))`, NHWC in and out) then
ai-edge-quantizer 0.10.0 recipe `static_wi8_ai8` (its default min/max calibration, 8 random
inputs): int8 input and output, and the quantizer's op versions (CONV_2D v1, FULLY_CONNECTED v5,
TRANSPOSE_CONV v3). The weights are random (seeded), so the files test arithmetic, not accuracy.
tests/test_emulator_torch_route.py runs them on the emulator against BUILTIN_REF.

- clean: depthwise, residual, BN, ReLU6, global average pool, linear (the route's clean case;
  litert-torch writes the NCHW mean as TRANSPOSE + MEAN).
- mixed: the CPU-side ops of partially mapped models: HARD_SWISH, LEAKY_RELU (left float by the
  quantizer: DEQUANTIZE, float LEAKY_RELU, QUANTIZE), PReLU (as RELU, MUL, SUB), TRANSPOSE_CONV,
  PAD, index_select (GATHER_ND), permute (TRANSPOSE), CONCATENATION.
- v3ish: MobileNetV3-style blocks: hardswish, squeeze-excitation with hardsigmoid, 5x5 depthwise.

Regenerate (needs the converter libraries, not in the service's venv; ~25 s):
    python tests/torch_route/make_models.py tests/torch_route
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

SIZES = {"clean": 32, "mixed": 32, "v3ish": 64}


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.pw(self.dw(y))
        return self.head(y.mean(dim=(2, 3)))


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.hs = nn.Hardswish()
        self.leaky = nn.LeakyReLU(0.1)
        self.prelu = nn.PReLU(8)
        self.up = nn.ConvTranspose2d(8, 8, 2, 2)
        self.conv2 = nn.Conv2d(8, 8, 3, 1, 0)
        self.head = nn.Linear(8 * 8, 10)
        self.register_buffer("order", torch.tensor([7, 6, 5, 4, 3, 2, 1, 0]))

    def forward(self, x):
        y = self.prelu(self.leaky(self.hs(self.conv(x))))
        y = self.conv2(nn.functional.pad(self.up(y), (1, 1, 1, 1)))
        y = torch.index_select(y, 1, self.order).permute(0, 2, 3, 1).mean(dim=(1, 2))
        return self.head(torch.cat([y, y * 0.5, y, y, y, y, y, y], dim=1))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(s))))


class Block(nn.Module):
    def __init__(self, channels, expanded, activation):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(channels, expanded, 1, bias=False), nn.BatchNorm2d(expanded),
                                    activation())
        self.dw = nn.Sequential(nn.Conv2d(expanded, expanded, 5, 1, 2, groups=expanded, bias=False),
                                nn.BatchNorm2d(expanded), activation())
        self.se = SqueezeExcitation(expanded)
        self.project = nn.Sequential(nn.Conv2d(expanded, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.project(self.se(self.dw(self.expand(x))))


class V3ish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.b1 = Block(16, 64, nn.ReLU)
        self.b2 = Block(16, 48, nn.Hardswish)
        self.head = nn.Sequential(nn.Conv2d(16, 96, 1), nn.Hardswish())
        self.classifier = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, 10))

    def forward(self, x):
        y = self.head(self.b2(self.b1(self.stem(x))))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def convert(module: nn.Module, size: int, float_path: Path, int8_path: Path) -> None:
    import litert_torch
    from ai_edge_quantizer import quantizer, recipe

    sample = (torch.rand(1, 3, size, size) * 2 - 1).permute(0, 2, 3, 1).contiguous()  # NHWC
    litert_torch.convert(litert_torch.to_channel_last_io(module.eval(), args=[0]).eval(), (sample,)).export(
        str(float_path))
    q = quantizer.Quantizer(str(float_path))
    q.load_quantization_recipe(recipe.static_wi8_ai8())
    rng = np.random.default_rng(0)
    data = [{"args_0": rng.uniform(-1, 1, (1, size, size, 3)).astype(np.float32)} for _ in range(8)]
    q.quantize(q.calibrate({"serving_default": data})).export_model(str(int8_path), overwrite=True)


def main(out: Path) -> None:
    for name, cls in {"clean": Clean, "mixed": Mixed, "v3ish": V3ish}.items():
        torch.manual_seed(0)
        float_path = out / f"{name}_float.tflite"
        convert(cls(), SIZES[name], float_path, out / f"{name}_int8.tflite")
        float_path.unlink()
        print(out / f"{name}_int8.tflite")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
