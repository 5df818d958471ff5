"""The pixel work of the face commands, run on the face threads (never the event loop): the photo decoded upright
at full size, the faces the detector found placed in its pixels, the region the gallery keeps around a face, and the
embedder's input tensor (aligned on 5 landmarks where the detector gives them, else cropped around the box at the
embedder's aspect ratio, enlarged by its model.json face.crop_margin: app/faces/align.py).

The detector runs through the core on the photo as every detection request does; its boxes come back in the photo's
pixels as a viewer shows it (EXIF orientation applied), which is how `full_photo` decodes it. A JPEG too large to
decode whole (over max_decoded_pixels) is decoded at a DCT reduction, and the boxes are scaled to it (`Found.scale`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from app.faces.align import face_input, region_input
from app.faces.regions import FaceRegion, cut_region
from app.imaging.decoding import decode_with_source
from app.imaging.geometry import to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.schema import InputSpec
from app.tasks.detect import DetectedObject, LandmarkedObject

LANDMARKS = 5  # what alignment takes: eye, eye, nose tip, mouth corner, mouth corner
# Decoded whole: a stretch to this size asks for every pixel of any photo up to it (JPEGs larger are reduced).
_WHOLE = InputSpec(width=4096, height=4096, resize="stretch", mean=[0.0], std=[1.0])


@dataclass(frozen=True)
class Face:
    """A face the detector found: its box (left, top, right, bottom) and landmarks in the original photo's pixels,
    the detector's confidence."""

    box: tuple[float, float, float, float]
    confidence: float
    landmarks: tuple[tuple[float, float], ...] = ()

    @property
    def area(self) -> float:
        return max(0.0, self.box[2] - self.box[0]) * max(0.0, self.box[3] - self.box[1])

    @classmethod
    def of(cls, found: DetectedObject) -> Face:
        box = (found.box.x_min, found.box.y_min, found.box.x_max, found.box.y_max)
        points = getattr(found, "landmarks", ()) if isinstance(found, LandmarkedObject) else ()
        landmarks = tuple((p.x, p.y) for p in points) if len(points) == LANDMARKS else ()
        return cls(box, float(found.score), landmarks)


@dataclass(frozen=True)
class Photo:
    """A photo decoded upright, and the factor from the original's pixels (the boxes') to its own."""

    image: Image.Image
    scale: float

    def place(self, face: Face) -> tuple[tuple[float, ...], tuple[tuple[float, float], ...]]:
        s = self.scale
        return tuple(v * s for v in face.box), tuple((x * s, y * s) for x, y in face.landmarks)


def full_photo(data: bytes, max_pixels: int, **decode_options) -> Photo:
    """The photo decoded as the core decodes it (the same limits, EXIF orientation, RGB), at full size."""
    image, source = decode_with_source(data, _WHOLE, max_pixels, **decode_options)
    return Photo(image, image.width / source.width)


def largest(faces: list[Face]) -> Face:
    """The largest face (by box area; the first found of equal ones): the one a registration keeps."""
    return max(faces, key=lambda face: face.area)


def region_of(photo: Photo, face: Face) -> FaceRegion:
    """The region the gallery keeps around the face (app/faces/regions.py)."""
    box, landmarks = photo.place(face)
    return cut_region(photo.image, box, landmarks)


def input_of_face(photo: Photo, face: Face, size: tuple[int, int], margin: float) -> Image.Image:
    """The embedder's input from the photo: aligned, or cropped around the box."""
    box, landmarks = photo.place(face)
    return face_input(photo.image, box, landmarks, size, margin)


def input_of_region(region: FaceRegion, size: tuple[int, int], margin: float) -> Image.Image:
    """The embedder's input from a stored region (a registration, a re-embedding): the same way."""
    return region_input(region, size, margin)


def embedder_tensor(image: Image.Image, spec: InputSpec, quantizer: InputQuantizer) -> np.ndarray:
    """The embedder's input tensor [1, H, W, C] from its input image (already its size: the resize is none)."""
    return quantizer(to_pixels(image, spec, image.size))
