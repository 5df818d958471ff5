"""The region the gallery keeps around each face: what re-embedding needs when the embedder changes.

An embedder never sees the detector's box as it is. It sees a crop made from it: aligned on the landmarks
(ArcFace's 112x112 template puts the eyes 35 pixels apart, so its crop spans about 1.4-1.6 times a detector's
box), or, without landmarks, the box enlarged by a margin at the embedder's aspect ratio (FaceNet's 32 pixels on
160 is 1.25 times; VGGFace2's is 1.3). Alignment also rotates the crop by the face's roll; a square turned by 45
degrees needs sqrt(2) times its side to hold it. So a future embedder may need up to about 1.6 * 1.41 = 2.26
times the box, and a landmark detector run again inside the region needs context around the face.

The region is therefore a square centred on the face box, REGION_SCALE = 2.5 times the box's longer side, cut
from the decoded photo and clipped to it (what lies outside the photo was never there: the embedder pads it the
same way at registration and at re-embedding). It is scaled down, never up, so that the box's longer side is at
most FACE_MAX_PX = 224 pixels, the largest input of face embedders in use (112 ArcFace and MobileFaceNet, 160
FaceNet, 224 VGGFace2), and stored as a JPEG at quality 95 without chroma subsampling: about 60-120 kB a face
where a PNG is three to four times that. The face's box and landmarks are kept in the region's pixels.

Embed from `FaceRegion.pixels()`, the stored bytes decoded, at registration as at re-embedding: the vectors of
one model are then made from the same pixels whichever time they were made.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from app.faces.errors import InvalidFace

REGION_SCALE = 2.5        # the region's side over the face box's longer side (the reasons above)
FACE_MAX_PX = 224         # the face box's longer side in the stored region, at most (scaled down, never up)
JPEG_QUALITY = 95
REGION_MAX_SIDE = 1024    # a stored region's width and height, at most (cut_region's are at most 561)
REGION_MAX_BYTES = 1 << 20
LANDMARKS_MAX = 128       # 5 from most face detectors, 68 or 106 from landmark models

Box = tuple[float, float, float, float]  # left, top, right, bottom, in pixels (continuous: a pixel is 1 wide)
Point = tuple[float, float]


@dataclass(frozen=True)
class FaceRegion:
    """A face's region as stored: the encoded image, its size, and the face's box and landmarks in its pixels."""

    image: bytes
    width: int
    height: int
    box: Box
    landmarks: tuple[Point, ...] = ()

    def pixels(self) -> Image.Image:
        """The stored image decoded, in RGB: what an embedder crops from."""
        with Image.open(io.BytesIO(self.image)) as image:
            return image.convert("RGB")


def cut_region(image: Image.Image, box: Sequence[float], landmarks: Sequence[Sequence[float]] = ()) -> FaceRegion:
    """The region around the face at `box` (and its `landmarks`) in `image`, the decoded photo at full size."""
    left, top, right, bottom = check_box(box)
    width, height = image.size
    if right <= 0 or bottom <= 0 or left >= width or top >= height:
        raise InvalidFace(f"the face box {tuple(box)} lies outside the {width}x{height} image")
    longer = max(right - left, bottom - top)
    half = REGION_SCALE * longer / 2
    cx, cy = (left + right) / 2, (top + bottom) / 2
    crop = (max(0, math.floor(cx - half)), max(0, math.floor(cy - half)),
            min(width, math.ceil(cx + half)), min(height, math.ceil(cy + half)))
    region = image.crop(crop)
    region = region if region.mode == "RGB" else region.convert("RGB")
    scale = min(1.0, FACE_MAX_PX / longer)
    if scale < 1.0:
        size = (max(1, round(region.width * scale)), max(1, round(region.height * scale)))
        region = region.resize(size, Image.Resampling.LANCZOS)
    # continuous coordinates: the crop's edges map onto the resized image's edges, axis by axis
    sx, sy = region.width / (crop[2] - crop[0]), region.height / (crop[3] - crop[1])

    def place(x: float, y: float) -> Point:
        return ((x - crop[0]) * sx, (y - crop[1]) * sy)

    out = io.BytesIO()
    region.save(out, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return FaceRegion(out.getvalue(), region.width, region.height, (*place(left, top), *place(right, bottom)),
                      tuple(place(*check_point(p)) for p in landmarks))


def check_region(region: object) -> FaceRegion:
    """The region, if the gallery can keep it: a JPEG or PNG that decodes whole at its stated size, with a face box
    that overlaps it and finite landmarks. InvalidFace otherwise. Decodes it once (about a millisecond)."""
    if not isinstance(region, FaceRegion):
        raise InvalidFace(f"a face is stored as a FaceRegion; got {type(region).__name__}")
    if not isinstance(region.image, bytes | bytearray) or not 0 < len(region.image) <= REGION_MAX_BYTES:
        raise InvalidFace(f"a face region's image is 1 to {REGION_MAX_BYTES} bytes")
    if not (isinstance(region.width, int) and isinstance(region.height, int)
            and 0 < region.width <= REGION_MAX_SIDE and 0 < region.height <= REGION_MAX_SIDE):
        raise InvalidFace(f"a face region is 1 to {REGION_MAX_SIDE} pixels a side; got "
                          f"{region.width!r}x{region.height!r}")
    try:
        with Image.open(io.BytesIO(region.image)) as image:
            found, size = image.format, image.size
            if found in ("JPEG", "PNG"):
                image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise InvalidFace(f"a face region's image does not decode: {error}") from None
    if found not in ("JPEG", "PNG"):
        raise InvalidFace(f"a face region is a JPEG or a PNG; got {found}")
    if size != (region.width, region.height):
        raise InvalidFace(f"a face region's image is {size[0]}x{size[1]}; it says {region.width}x{region.height}")
    left, top, right, bottom = check_box(region.box)
    if right <= 0 or bottom <= 0 or left >= region.width or top >= region.height:
        raise InvalidFace(f"the face box {region.box} lies outside its {region.width}x{region.height} region")
    if len(region.landmarks) > LANDMARKS_MAX:
        raise InvalidFace(f"a face has at most {LANDMARKS_MAX} landmarks; got {len(region.landmarks)}")
    landmarks = tuple(check_point(p) for p in region.landmarks)
    return FaceRegion(bytes(region.image), region.width, region.height, (left, top, right, bottom), landmarks)


def check_box(box: object) -> Box:
    """(left, top, right, bottom) as floats, if finite with right > left and bottom > top; InvalidFace otherwise."""
    try:
        left, top, right, bottom = (float(v) for v in box)
    except (TypeError, ValueError):
        raise InvalidFace(f"a face box is four numbers (left, top, right, bottom); got {box!r:.80}") from None
    if not all(math.isfinite(v) for v in (left, top, right, bottom)) or right <= left or bottom <= top:
        raise InvalidFace(f"a face box is finite with right > left and bottom > top; got {box!r:.80}")
    return left, top, right, bottom


def check_point(point: object) -> Point:
    """(x, y) as floats, if finite; InvalidFace otherwise."""
    try:
        x, y = (float(v) for v in point)
    except (TypeError, ValueError):
        raise InvalidFace(f"a landmark is two numbers (x, y); got {point!r:.80}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise InvalidFace(f"a landmark is finite; got {point!r:.80}")
    return x, y
