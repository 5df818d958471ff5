"""Segmentation: a model's class map -> the classes present and the class of every pixel of the original image.

One role, `class_map`: the model's one output, either an ARG_MAX class map, int32/int64 [1, H, W] (Coral's
DeepLab v3 files: int64 [1, 513, 513]), or per-pixel class scores [1, H, W, C] (a U-Net; 8-bit or float), of
which the class of a pixel is the highest-scoring one (the first on a tie, as TFLite's ARG_MAX). The map
covers the model's whole input, whatever its resolution.

Back to the original image (app/imaging/geometry.py Geometry: stretch, center crop, letterbox; EXIF orientation
is applied by decoding, so the geometry is already the upright image's): each original pixel takes the class
of the map pixel its centre falls on (nearest; classes are labels, never interpolated). Pixels the model never
saw (outside a center crop's region) have no class: they are UNSEEN (255, PASCAL VOC's "void") in the mask,
and left out of the fractions, which are of the pixels the model saw (`seen`: their fraction of the image).
Letterbox padding covers no original pixel and so counts nowhere.

The fractions come from the map alone (how many original rows and columns fall on each map row and column),
exact and without building the full-size mask; `Segmentation.mask()` builds it when it is asked for (the PNG),
and `png()` encodes it: one byte per pixel whose value is the class id (16 bits for a model of more than 255
classes), with PASCAL VOC's colour palette so that a viewer shows it in colour. A front door that sends the PNG
makes it off the event loop (a 12-megapixel photo's mask and PNG take a few hundred ms).

No options. Its result (`Segmentation`): the original image's size, the classes present (`class_id`, `label`,
`fraction`), `seen`, and, kept for the mask but never sent as JSON, the class map and how the image falls on it;
its other form is the PNG mask (`renders["png"]`). As named tensors (OIP v2): `class_map`,
the class of each pixel of the model's own map, int32 [H, W].
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.errors import ModelDirError
from app.imaging.geometry import Geometry
from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task
from app.tasks.results import ClassId, ImageSize, Internal, Label, OriginalImage, Render, label_of

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

CLASS_MAP = "class_map"
# TFLite types of a class map (ARG_MAX's output_type), as the converter names them (app/tflite_file.py).
CLASS_MAP_TYPES = ("INT32", "INT64")
UNSEEN = 255          # a pixel the model did not see, in an 8-bit mask (PASCAL VOC's void / ignore label)
UNSEEN_16 = 65535     # the same in a 16-bit mask (more than 255 classes)
MAX_CLASSES_8_BIT = 255  # class ids 0-254 leave 255 for UNSEEN


@dataclass(frozen=True)
class ClassShare:
    class_id: ClassId
    label: Label
    fraction: Annotated[float, Field(description="its share of the pixels the model saw")]


@dataclass(frozen=True)
class Sampling:
    """Where each row and column of the original image falls in the class map: the map row (column) its pixel
    centres fall on, and whether the model saw it at all."""

    rows: np.ndarray      # int64 [height]: map row of each image row
    cols: np.ndarray      # int64 [width]
    row_seen: np.ndarray  # bool [height]
    col_seen: np.ndarray  # bool [width]

    @property
    def seen(self) -> float:
        """The fraction of the image's pixels the model saw."""
        return float(self.row_seen.mean() * self.col_seen.mean())


@dataclass(frozen=True)
class Segmentation:
    """The classes in the original image and their share of it (the class map kept for the mask)."""

    image: OriginalImage
    classes: Annotated[list[ClassShare], Field(description="the classes present, most pixels first")]
    seen: Annotated[float, Field(description="the share of the image the model saw: 1 but for a center crop (the "
                                             "pixels outside it have no class)")]
    class_map: Annotated[np.ndarray, Internal]  # the model's map [H, W] (int64), at its own resolution
    sampling: Annotated[Sampling, Internal]     # how the image's pixels fall on it
    class_count: Annotated[int, Internal]       # the model's classes (labels), for the mask's depth

    def mask(self) -> np.ndarray:
        """The class of every pixel of the original image (UNSEEN where the model did not look)."""
        return mask(self.class_map, self.sampling, self.class_count)

    def png(self) -> bytes:
        """The mask as PNG (a few hundred ms for a 12-megapixel photo: make it off the event loop)."""
        return png(self.mask())


class SegmentationTask(Task, name="segmentation", verb="segment", summary="Segment an image"):
    roles = (CLASS_MAP,)
    renders = {"png": Render("image/png", "the mask, one byte per pixel whose value is the class id (255: not "
                                          "seen), at the original image's size", Segmentation.png)}

    def read(self, outputs: Outputs, options) -> Segmentation:
        geometry, labels = outputs.geometry, outputs.model_dir.labels
        cmap = class_map(outputs.of(CLASS_MAP))
        where = sampling(geometry, *cmap.shape)
        return Segmentation(ImageSize(geometry.width, geometry.height), shares(cmap, where, labels), where.seen,
                            cmap, where, len(labels))

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        spec = roles.specs[CLASS_MAP]
        shape, labels = tuple(spec.shape), len(model_dir.labels)
        is_map = np.issubdtype(spec.dtype, np.integer) and spec.dtype.itemsize >= 4 and (
            len(shape) == 3 or (len(shape) == 4 and shape[3] == 1))
        is_scores = len(shape) == 4 and shape[3] >= 2 and (spec.dtype == np.float32 or spec.dtype.itemsize == 1)
        if shape[:1] != (1,) or not (is_map or is_scores) or int(np.prod(shape[1:3])) < 1:
            raise ModelDirError(
                f"model {model_dir.name!r} (segmentation): its class_map output {spec.name!r} is {spec.dtype.name} "
                f"{list(shape)}; a segmenter gives an ARG_MAX class map, int32/int64 [1, H, W], or per-pixel class "
                "scores [1, H, W, C]")
        if is_scores and labels and labels != shape[3]:
            raise ModelDirError(f"model {model_dir.name!r} (segmentation): labels.txt names {labels} classes, its "
                                f"output {spec.name!r} scores {shape[3]}")

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        spec = roles.specs[CLASS_MAP]
        return [NamedOutput(CLASS_MAP, np.dtype(np.int32), tuple(spec.shape[1:3]))]

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        return {CLASS_MAP: class_map(outputs.of(CLASS_MAP)).astype(np.int32)}


TASK = SegmentationTask()


def class_map(output: np.ndarray) -> np.ndarray:
    """The model's output -> its class map [H, W] (int64): as it is for a map, the argmax over the channels for
    scores (the raw 8-bit values order as their dequantized ones: a positive scale keeps the order)."""
    if output.ndim == 4 and output.shape[3] > 1:
        return np.argmax(output[0], axis=-1).astype(np.int64)
    return output.reshape(output.shape[1], output.shape[2]).astype(np.int64)


def sampling(geometry: Geometry, map_height: int, map_width: int) -> Sampling:
    """Each original row and column -> the map row and column its pixel centres fall on.

    A pixel centre x + 0.5 of the original is at u = offset + (x + 0.5 - left) / (right - left) * fill of the
    model's input (normalized), the inverse of Geometry.to_original; the map covers the input, so it falls on map
    column floor(u * map_width). The model saw it when offset <= u < offset + fill."""
    left, top, right, bottom = geometry.box
    rows, row_seen = _axis(geometry.height, top, bottom, geometry.fill[1], geometry.offset[1], map_height)
    cols, col_seen = _axis(geometry.width, left, right, geometry.fill[0], geometry.offset[0], map_width)
    return Sampling(rows, cols, row_seen, col_seen)


def _axis(size: int, start: float, end: float, fill: float, offset: float,
          cells: int) -> tuple[np.ndarray, np.ndarray]:
    centres = np.arange(size, dtype=np.float64) + 0.5
    u = (centres - start) / (end - start) * fill
    seen = (u >= 0) & (u < fill)
    u += offset
    index = np.clip(np.floor(u * cells), 0, cells - 1).astype(np.int64)
    return index, seen


def shares(cmap: np.ndarray, where: Sampling, labels: tuple[str, ...]) -> list[ClassShare]:
    """The classes on the pixels the model saw, with their fraction of those pixels, most first (ties by id).

    Exact without the full-size mask: the pixels on map cell (r, c) are (image rows on r) x (image columns
    on c)."""
    height, width = cmap.shape
    row_weight = np.bincount(where.rows[where.row_seen], minlength=height).astype(np.float64)
    col_weight = np.bincount(where.cols[where.col_seen], minlength=width).astype(np.float64)
    total = row_weight.sum() * col_weight.sum()
    if total == 0:
        return []
    ids, weights = cmap.reshape(-1), np.outer(row_weight, col_weight).reshape(-1)
    if ids.size and ids.min() < 0:  # no class (a corrupt map): left out
        keep = ids >= 0
        ids, weights = ids[keep], weights[keep]
    counts = np.bincount(ids, weights=weights)
    present = np.flatnonzero(counts)
    order = present[np.argsort(-counts[present], kind="stable")]
    return [ClassShare(int(i), label_of(int(i), labels), float(counts[i] / total)) for i in order.tolist()]


def mask(cmap: np.ndarray, where: Sampling, class_count: int) -> np.ndarray:
    """The class of every original pixel [height, width]: uint8 with UNSEEN, or uint16 with UNSEEN_16 for a model
    of more than MAX_CLASSES_8_BIT classes."""
    wide = class_count > MAX_CLASSES_8_BIT or (cmap.size and int(cmap.max()) >= MAX_CLASSES_8_BIT)
    dtype, unseen = (np.uint16, UNSEEN_16) if wide else (np.uint8, UNSEEN)
    small = np.where((cmap >= 0) & (cmap < unseen), cmap, unseen).astype(dtype)
    out = small.take(where.cols, axis=1).take(where.rows, axis=0)  # columns of the small map first: 15x np.ix_
    out[~where.row_seen, :] = unseen
    out[:, ~where.col_seen] = unseen
    return out


def palette() -> list[int]:
    """PASCAL VOC's colour map (class i's colour from the bits of i), 256 RGB entries: 0 black, 15 (person) pink,
    255 (void) cream, as in the VOC ground-truth PNGs and DeepLab's demos."""
    colours = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        colours += [r, g, b]
    return colours


_PALETTE = palette()
PNG_COMPRESS_LEVEL = 1  # masks compress well at any level; level 1 is the fast one


def png(pixels: np.ndarray) -> bytes:
    """A mask as PNG: 8-bit palette (the value of each pixel is its class id; VOC colours), or 16-bit grey."""
    from PIL import Image

    height, width = pixels.shape
    if pixels.dtype == np.uint8:
        image = Image.frombytes("P", (width, height), np.ascontiguousarray(pixels).tobytes())
        image.putpalette(_PALETTE)
    else:
        image = Image.frombytes("I;16", (width, height), pixels.astype("<u2").tobytes())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buffer.getvalue()
