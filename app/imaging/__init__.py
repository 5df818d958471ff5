"""Image bytes -> the pixels a model expects -> its input tensor. The converter calibrates through these same
functions, so the int8 ranges fit what the service feeds.

  decoding.py      bytes -> upright RGB (or L) Pillow image, refusing bombs, damaged files and non-images;
                   JPEGs are scaled down in the DCT domain when the model needs far fewer pixels
                   (decode_with_source() also says what the original was: Source);
  geometry.py      model.json's geometry (center crop, stretch or letterbox, by its maker's convention) -> uint8
                   HxWxC pixels (to_pixels), and back: Geometry maps a point of the model's input to the original's
                   pixels as that convention maps a box back;
  quantization.py  uint8 pixels -> the input tensor, through the normalisation in model.json and the input
                   tensor's own scale and zero point, rounded as the convention rounds (InputQuantizer).
`prepare()` is decode + to_pixels, as the converter calibrates with it; the service runs the same steps on its
image threads (app/core/images.py ImageWork).
"""

from __future__ import annotations

import numpy as np

from app.imaging.decoding import decode_with_source
from app.imaging.geometry import to_pixels
from app.model_dir.schema import InputSpec


def prepare(data: bytes, spec: InputSpec, max_pixels: int, **decode_options) -> np.ndarray:
    """decode + to_pixels: the whole image preprocessing, as the converter calibrates with it."""
    image, source = decode_with_source(data, spec, max_pixels, **decode_options)
    return to_pixels(image, spec, (source.width, source.height))
