"""Where an image's pixels go in the model's input, as model.json says (center crop, stretch or letterbox, by its
maker's convention), and back: `to_pixels()` makes the input's uint8 pixels in one resampling pass; `Geometry` maps
a point of the input to the original image's pixels, exactly as the convention maps a box back (a detector's boxes).

A letterbox by Coral's convention (pycoral's set_resized_input) puts the image at the input's top-left and pads the
rest with black. By Ultralytics' (its LetterBox(center=True) and scale_boxes; YOLOv5's letterbox places it alike),
with r = min(H / h, W / w) for an h x w image and an H x W input:
  - the image becomes (round(w r), round(h r)) pixels (Python's round: halves to even);
  - it is placed at left = round(dw / 2 - 0.1), top = round(dh / 2 - 0.1), dw and dh the padding's total, so an odd
    padding puts its extra pixel right or below; the padding is grey 114;
  - a box comes back as (x - left) / r, as the current scale_boxes maps it (YOLOv5's and earlier Ultralytics versions
    took the padding from the unrounded size (W - w r) / 2: less than one input pixel off the placement).
Its geometry is computed on the original's size (as a viewer shows it), also when a JPEG is decoded at reduced scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from app.model_dir.schema import ULTRALYTICS, InputSpec

RESAMPLE = Image.Resampling.BILINEAR


def draft_size(width: int, height: int, spec: InputSpec, max_pixels: int | None = None) -> tuple[int, int]:
    """The smallest full-image size whose crop still covers the model's input: what a JPEG may be decoded down to in
    the DCT. By Ultralytics' convention the whole image, as its maker's tools resample it from a full decode (a DCT
    reduction is not their resize's pixels), unless that is more than `max_pixels`: then the least reduction under."""
    if spec.maker == ULTRALYTICS:
        return _whole(width, height, max_pixels)
    if spec.resize == "stretch":
        scale = max(spec.width / width, spec.height / height)
    elif spec.resize == "letterbox":  # the whole image fits inside: its longer side sets the size
        scale = min(spec.width / width, spec.height / height)
    else:
        crop_w, crop_h = _crop_size(width, height, spec)
        scale = max(spec.width / crop_w, spec.height / crop_h)
    return math.ceil(width * scale), math.ceil(height * scale)


def _whole(width: int, height: int, max_pixels: int | None) -> tuple[int, int]:
    """The whole image, or its 1/2, 1/4 or 1/8 (the DCT's reductions), the first of them of at most max_pixels."""
    for reduction in (1, 2, 4):
        size = (max(1, width // reduction), max(1, height // reduction))
        if max_pixels is None or size[0] * size[1] <= max_pixels:
            return size
    return max(1, width // 8), max(1, height // 8)


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


# Ultralytics' letterbox padding (LetterBox's default fill, before normalisation)
ULTRALYTICS_PAD = 114


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


@dataclass(frozen=True)
class Letterbox:
    """Ultralytics' letterbox of a width x height image: its ratio, the size it is resized to and where it is
    placed (left, top), in input pixels."""

    ratio: float
    size: tuple[int, int]
    at: tuple[int, int]

    @classmethod
    def ultralytics(cls, width: int, height: int, spec: InputSpec) -> Letterbox:
        ratio = min(spec.height / height, spec.width / width)
        size = (max(1, int(round(width * ratio))), max(1, int(round(height * ratio))))
        # the padding split in two, its odd pixel right or below: round(x - 0.1) is x's floor for halves
        at = (int(round((spec.width - size[0]) / 2 - 0.1)), int(round((spec.height - size[1]) / 2 - 0.1)))
        return cls(ratio, size, at)


def centred(spec: InputSpec) -> bool:
    """Whether the model's letterbox is Ultralytics' (centred on grey), not Coral's (top-left on black)."""
    return spec.resize == "letterbox" and spec.maker == ULTRALYTICS


def to_pixels(image: Image.Image, spec: InputSpec, original: tuple[int, int] | None = None) -> np.ndarray:
    """Crop/resize to the model's geometry in one resampling pass; uint8 HxWxC. A letterbox is padded as the model's
    convention pads it (Coral's: black at the right or bottom; Ultralytics': grey 114 around the centre, its geometry
    from `original`, the image's size before a reduced-scale decode, when given)."""
    if centred(spec):
        return _centred(image, spec, original or image.size)
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


def _centred(image: Image.Image, spec: InputSpec, original: tuple[int, int]) -> np.ndarray:
    """Ultralytics' letterbox: the whole image resized to the letterbox's size, placed at its corner, on grey."""
    box = Letterbox.ultralytics(*original, spec)
    resized = image if image.size == box.size else image.resize(box.size, RESAMPLE)
    pixels = np.asarray(resized, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    padded = np.full((spec.height, spec.width, pixels.shape[2]), ULTRALYTICS_PAD, np.uint8)
    (left, top), (w, h) = box.at, box.size
    padded[top:top + h, left:left + w] = pixels
    return padded


@dataclass(frozen=True)
class Geometry:
    """Where the model's input came from in the original image: a point of the input, normalized (0..1, as a
    detector's boxes are), back to the original's pixels as a viewer shows it, exactly as preprocessing mapped
    it forward (crop, stretch or letterbox; a JPEG decoded at reduced scale; EXIF orientation)."""

    width: int                                   # the original image, as a viewer shows it
    height: int
    box: tuple[float, float, float, float]  # the region of the original that was resized: left, top, right, bottom
    fill: tuple[float, float]               # the fraction of the input's width and height it filled (letterbox < 1)
    offset: tuple[float, float] = (0.0, 0.0)  # where in the input it starts, a fraction of each side (centred > 0)

    @classmethod
    def of(cls, source: Source, decoded: tuple[int, int], spec: InputSpec) -> Geometry:
        """The geometry of to_pixels() on a decoded image of size `decoded` from `source`."""
        if centred(spec):
            return cls.ultralytics(source.width, source.height, spec)
        (left, top, right, bottom), (w, h) = placement(*decoded, spec)
        s = source.scale
        return cls(source.width, source.height, (left * s, top * s, right * s, bottom * s),
                   (w / spec.width, h / spec.height))

    @classmethod
    def ultralytics(cls, width: int, height: int, spec: InputSpec) -> Geometry:
        """Ultralytics' scale_boxes for a width x height original: a point x of the input (in its pixels) is
        (x - left) / r of the original's, r the letterbox's ratio (not the rounded size's)."""
        box = Letterbox.ultralytics(width, height, spec)
        return cls(width, height, (0.0, 0.0, float(width), float(height)),
                   (width * box.ratio / spec.width, height * box.ratio / spec.height),
                   (box.at[0] / spec.width, box.at[1] / spec.height))

    @classmethod
    def identity(cls, width: int, height: int) -> Geometry:
        """The model's input was the original (a raw tensor): input coordinates are its pixels."""
        return cls(width, height, (0.0, 0.0, float(width), float(height)), (1.0, 1.0))

    def to_original(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalized input coordinates -> the original image's pixels (float64; not clipped)."""
        left, top, right, bottom = self.box
        return (left + (np.asarray(x, np.float64) - self.offset[0]) / self.fill[0] * (right - left),
                top + (np.asarray(y, np.float64) - self.offset[1]) / self.fill[1] * (bottom - top))
