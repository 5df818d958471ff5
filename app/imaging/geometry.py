"""Where an image's pixels go in the model's input, as model.json says (center crop, stretch or letterbox), and
back: `to_pixels()` makes the input's uint8 pixels in one resampling pass; `Geometry` maps a point of the input
to the original image's pixels, exactly as preprocessing mapped it forward (a detector's boxes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from app.model_dir.schema import InputSpec

RESAMPLE = Image.Resampling.BILINEAR


def draft_size(width: int, height: int, spec: InputSpec) -> tuple[int, int]:
    """The smallest full-image size whose crop still covers the model's input."""
    if spec.resize == "stretch":
        scale = max(spec.width / width, spec.height / height)
    elif spec.resize == "letterbox":  # the whole image fits inside: its longer side sets the size
        scale = min(spec.width / width, spec.height / height)
    else:
        crop_w, crop_h = _crop_size(width, height, spec)
        scale = max(spec.width / crop_w, spec.height / crop_h)
    return math.ceil(width * scale), math.ceil(height * scale)


def _crop_size(width: int, height: int, spec: InputSpec) -> tuple[float, float]:
    """Largest region with the model's aspect ratio, scaled by crop_fraction."""
    aspect = spec.width / spec.height
    if width / height > aspect:
        crop_h = height * spec.crop_fraction
        crop_w = crop_h * aspect
    else:
        crop_w = width * spec.crop_fraction
        crop_h = crop_w / aspect
    return crop_w, crop_h


def placement(width: int, height: int, spec: InputSpec) -> tuple[tuple[float, float, float, float], tuple[int, int]]:
    """Which region of a width x height image becomes the model's input, and where: (left, top, right, bottom) in
    the image's pixels, resized to (w, h) input pixels at the input's top-left. Stretch and center crop fill the
    input; letterbox fits the whole image inside it (its longer side spans the input), the rest being padding."""
    whole = (0.0, 0.0, float(width), float(height))
    if spec.resize == "stretch":
        return whole, (spec.width, spec.height)
    if spec.resize == "letterbox":
        scale = min(spec.width / width, spec.height / height)
        return whole, (min(spec.width, max(1, round(width * scale))), min(spec.height, max(1, round(height * scale))))
    crop_w, crop_h = _crop_size(width, height, spec)
    left, top = (width - crop_w) / 2, (height - crop_h) / 2
    return (left, top, left + crop_w, top + crop_h), (spec.width, spec.height)


def to_pixels(image: Image.Image, spec: InputSpec) -> np.ndarray:
    """Crop/resize to the model's geometry in one resampling pass (letterbox: padded with black at the right or
    bottom); uint8 HxWxC."""
    width, height = image.size
    box, size = placement(width, height, spec)
    if image.size == size and box == (0.0, 0.0, float(width), float(height)):
        resized = image
    else:
        resized = image.resize(size, RESAMPLE, box=box)
    pixels = np.asarray(resized, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if size != (spec.width, spec.height):  # letterbox: the image at the top-left of a black input
        padded = np.zeros((spec.height, spec.width, pixels.shape[2]), np.uint8)
        padded[:size[1], :size[0]] = pixels
        pixels = padded
    return pixels


@dataclass(frozen=True)
class Geometry:
    """Where the model's input came from in the original image: a point of the input, normalized (0..1, as a
    detector's boxes are), back to the original's pixels as a viewer shows it, exactly as preprocessing mapped
    it forward (crop, stretch or letterbox; a JPEG decoded at reduced scale; EXIF orientation)."""

    width: int                                   # the original image, as a viewer shows it
    height: int
    box: tuple[float, float, float, float]  # the region of the original that was resized: left, top, right, bottom
    fill: tuple[float, float]               # the fraction of the input's width and height it filled (letterbox < 1)

    @classmethod
    def of(cls, source: Source, decoded: tuple[int, int], spec: InputSpec) -> Geometry:
        """The geometry of to_pixels() on a decoded image of size `decoded` from `source`."""
        (left, top, right, bottom), (w, h) = placement(*decoded, spec)
        s = source.scale
        return cls(source.width, source.height, (left * s, top * s, right * s, bottom * s),
                   (w / spec.width, h / spec.height))

    @classmethod
    def identity(cls, width: int, height: int) -> Geometry:
        """The model's input was the original (a raw tensor): input coordinates are its pixels."""
        return cls(width, height, (0.0, 0.0, float(width), float(height)), (1.0, 1.0))

    def to_original(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalized input coordinates -> the original image's pixels (float64; not clipped)."""
        left, top, right, bottom = self.box
        return (left + np.asarray(x, np.float64) / self.fill[0] * (right - left),
                top + np.asarray(y, np.float64) / self.fill[1] * (bottom - top))
