"""How much quantization changed the answers: int8 top-1 vs the float model's, on real photos.

Each photo is looked at through several crops (the service's own center crop and four
corners), so one photo gives several different inputs, as different requests would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from app.imaging.decoding import decode
from app.imaging.geometry import to_pixels
from app.model_dir.schema import InputSpec

CORNER_FRACTION = 0.7
MAX_PIXELS = 100_000_000


def crops(image: Image.Image) -> list[Image.Image]:
    """The whole image, and its four corners at 70% of each side."""
    w, h = image.size
    cw, ch = int(w * CORNER_FRACTION), int(h * CORNER_FRACTION)
    boxes = [(0, 0, cw, ch), (w - cw, 0, w, ch), (0, h - ch, cw, h), (w - cw, h - ch, w, h)]
    return [image] + [image.crop(b) for b in boxes]


def evaluation_inputs(photos: Iterable[Path], spec: InputSpec) -> list[tuple[str, np.ndarray]]:
    """(name, uint8 pixels) for every crop of every photo."""
    inputs = []
    for path in photos:
        image = decode(Path(path).read_bytes(), spec, MAX_PIXELS)
        for i, crop in enumerate(crops(image)):
            inputs.append((f"{Path(path).name}#{i}", to_pixels(crop, spec)))
    return inputs


@dataclass
class Agreement:
    inputs: int
    top1_agreement: float
    float_top1_in_int8_top5: float
    disagreements: list[str]
    max_logit_error: float | None = None  # max |int8 - float| over every input and output (dequantized)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def compare(
    inputs: list[tuple[str, np.ndarray]],
    float_scores: Callable[[np.ndarray], np.ndarray],
    int8_scores: Callable[[np.ndarray], np.ndarray],
) -> Agreement:
    agree = in_top5 = 0
    error = 0.0
    disagreements = []
    for name, pixels in inputs:
        f = float_scores(pixels)
        q = int8_scores(pixels)
        error = max(error, float(np.max(np.abs(np.asarray(f, np.float64) - np.asarray(q, np.float64)))))
        f_top = int(np.argmax(f))
        # ties in the quantized output are real (several classes share a level):
        # the int8 top-1 is the first of them, as np.argmax and top-k both take it
        q_top = int(np.argmax(q))
        agree += f_top == q_top
        in_top5 += f_top in np.argsort(-q, kind="stable")[:5]
        if f_top != q_top:
            disagreements.append(f"{name}: float {f_top}, int8 {q_top}")
    n = len(inputs)
    return Agreement(n, round(agree / n, 4), round(in_top5 / n, 4), disagreements, round(error, 4))
