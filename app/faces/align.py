"""The embedder's input, made from a face: aligned on its 5 landmarks where the detector gives them, else cropped
around its box. From the photo decoded at full size, or from the gallery's stored region (FaceRegion: the box
and landmarks in the region's pixels), the same way.

**Alignment** maps the 5 landmarks (the eye, eye, nose tip, mouth corner, mouth corner, left to right as the
image shows them: RetinaFace's and SCRFD's order) onto the template the embedder was trained with, by the
similarity transform (rotation, uniform scale, translation) that fits them best in least squares: Umeyama's
solution (IEEE PAMI 13(4), 1991), the one insightface's norm_crop and scikit-image's SimilarityTransform use.
The template is ArcFace's for 112x112 (eyes at (38.29, 51.70) and (73.53, 51.50)); MobileFaceNet's 112 high
by 96 wide is the same face 8 pixels to the left (SphereFace's and CosFace's). For another input size the
template is scaled by height / 112 and centred across the width. The templates are written, as their authors
wrote them, in OpenCV's pixel indices (a pixel's centre at an integer); here every coordinate is continuous
(a pixel is 1 wide, its centre at i + 0.5: what Pillow and the gallery use), so the template is moved by half a
pixel before the fit, and the result is OpenCV's warpAffine of the same landmarks to the same template.

**Without landmarks** (a detector that gives boxes only, such as ULFD), the crop is the smallest rectangle at the
embedder's aspect ratio (96 / 112 for MobileFaceNet) that holds the box, around the box's centre, enlarged by
`margin` in both directions (0.2: 1.2 times; model.json's `face.crop_margin`, DEFAULT_MARGIN when it has none),
and scaled to the input.

Both are one affine map sampled bilinearly by Pillow at each output pixel's centre. A face much larger than the
input is first box-filtered by an integer factor (Image.reduce) so that the bilinear step shrinks it by at most
2: a bilinear sample of a large face reads 4 of its pixels and drops the rest (aliasing: the same face at two
sizes would make different inputs), and the gallery's regions are already scaled down. What lies outside the
photo is black, as OpenCV's warpAffine fills it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from app.faces.errors import InvalidFace
from app.faces.regions import FaceRegion, check_box, check_point

# ArcFace's 5-point template for 112x112, in OpenCV's pixel indices (insightface's arcface_dst)
ARCFACE_112 = ((38.2946, 51.6963), (73.5318, 51.5014), (56.0252, 71.7366), (41.5493, 92.3655), (70.7299, 92.2041))
TEMPLATE_SIDE = 112
LANDMARKS = 5
DEFAULT_MARGIN = 0.2     # a box-only crop's enlargement: 1.2 times the box (FaceNet's 32 pixels on 160 is 1.25)
MARGIN_MAX = 3.0
INPUT_MAX_SIDE = 1024    # an embedder's input side, at most (they are 96 to 224)
KEPT_MODES = ("RGB", "L", "F")  # other modes are converted to RGB (after the crop, never the whole photo)

Size = tuple[int, int]   # width, height: Pillow's order


@dataclass(frozen=True)
class Similarity:
    """A similarity transform, source -> target: x' = scale * R(angle) x + translation, as a 2x3 matrix; and the
    fit's root-mean-square residual in target pixels (how far the landmarks are from the template's shape)."""

    matrix: np.ndarray  # [2, 3] float64
    residual: float = 0.0

    @property
    def scale(self) -> float:
        return float(math.hypot(self.matrix[0, 0], self.matrix[1, 0]))

    @property
    def angle_degrees(self) -> float:
        return float(math.degrees(math.atan2(self.matrix[1, 0], self.matrix[0, 0])))

    def apply(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, np.float64).reshape(-1, 2)
        return points @ self.matrix[:, :2].T + self.matrix[:, 2]


def template(size: Size) -> np.ndarray:
    """The 5-point template for an input of `size` (width, height), in continuous coordinates [5, 2]."""
    width, height = _check_size(size)
    ratio = height / TEMPLATE_SIDE
    points = np.asarray(ARCFACE_112, np.float64) + 0.5  # OpenCV's indices -> continuous
    points[:, 0] = (points[:, 0] - TEMPLATE_SIDE / 2) * ratio + width / 2
    points[:, 1] = points[:, 1] * ratio
    return points


def similarity_transform(source: np.ndarray, target: np.ndarray) -> Similarity:
    """The similarity transform that maps `source` points [n, 2] onto `target` points [n, 2] with the least sum
    of squared distances (Umeyama 1991: the SVD of the cross-covariance; a reflection is never chosen)."""
    src, dst = np.asarray(source, np.float64), np.asarray(target, np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 2 or len(src) < 2:
        raise InvalidFace(f"a similarity is fitted to two sets of the same number (2 or more) of (x, y) points; got "
                          f"{src.shape} and {dst.shape}")
    if not (np.isfinite(src).all() and np.isfinite(dst).all()):
        raise InvalidFace("landmarks are finite numbers")
    src_mean, dst_mean = src.mean(0), dst.mean(0)
    x, y = src - src_mean, dst - dst_mean
    src_variance = float((x * x).sum() / len(src))
    if src_variance <= 1e-12:
        raise InvalidFace("the landmarks are all at one point: no face to align")
    covariance = y.T @ x / len(src)
    u, d, vt = np.linalg.svd(covariance)
    signs = np.ones(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        signs[1] = -1.0
    rotation = u @ np.diag(signs) @ vt
    scale = float((d * signs).sum() / src_variance)
    matrix = np.empty((2, 3))
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = dst_mean - matrix[:, :2] @ src_mean
    fitted = Similarity(matrix)
    residual = float(np.sqrt(((fitted.apply(src) - dst) ** 2).sum(1).mean()))
    return Similarity(matrix, residual)


def alignment(landmarks: Sequence[Sequence[float]], size: Size) -> Similarity:
    """The map from the photo's pixels (where the 5 `landmarks` are) to the embedder's input of `size`."""
    points = _points(landmarks)
    if len(points) != LANDMARKS:
        raise InvalidFace(f"alignment takes {LANDMARKS} landmarks (eyes, nose tip, mouth corners); got {len(points)}")
    return similarity_transform(points, template(size))


def aligned(image: Image.Image, landmarks: Sequence[Sequence[float]], size: Size) -> Image.Image:
    """The embedder's input of `size` (width, height), aligned on the face's 5 landmarks in `image`'s pixels."""
    fit = alignment(landmarks, size)
    return warp(image, fit.matrix, size)


def crop_box(box: Sequence[float], size: Size, margin: float = DEFAULT_MARGIN) -> tuple[float, float, float, float]:
    """The box-only crop (left, top, right, bottom): the smallest rectangle at `size`'s aspect ratio that holds
    the face `box`, centred on it, enlarged `1 + margin` times."""
    left, top, right, bottom = check_box(box)
    width, height = _check_size(size)
    margin = check_margin(margin)
    aspect = width / height
    box_w, box_h = right - left, bottom - top
    crop_h = max(box_h, box_w / aspect) * (1 + margin)
    crop_w = crop_h * aspect
    cx, cy = (left + right) / 2, (top + bottom) / 2
    return cx - crop_w / 2, cy - crop_h / 2, cx + crop_w / 2, cy + crop_h / 2


def cropped(image: Image.Image, box: Sequence[float], size: Size, margin: float = DEFAULT_MARGIN) -> Image.Image:
    """The embedder's input of `size` (width, height), cropped around the face `box` in `image`'s pixels."""
    left, top, right, bottom = crop_box(box, size, margin)
    width, height = size
    sx, sy = width / (right - left), height / (bottom - top)
    matrix = np.array([[sx, 0.0, -left * sx], [0.0, sy, -top * sy]])
    return warp(image, matrix, size)


def face_input(image: Image.Image, box: Sequence[float], landmarks: Sequence[Sequence[float]], size: Size,
               margin: float = DEFAULT_MARGIN) -> Image.Image:
    """The embedder's input for one face: aligned when it has 5 landmarks, cropped around its box otherwise."""
    if len(landmarks) == LANDMARKS:
        return aligned(image, landmarks, size)
    return cropped(image, box, size, margin)


def region_input(region: FaceRegion, size: Size, margin: float = DEFAULT_MARGIN) -> Image.Image:
    """The embedder's input from a face the gallery keeps: its region decoded, its box and landmarks."""
    return face_input(region.pixels(), region.box, region.landmarks, size, margin)


def warp(image: Image.Image, matrix: np.ndarray, size: Size) -> Image.Image:
    """`image` through the affine `matrix` ([2, 3], image pixels -> output pixels, continuous coordinates),
    sampled bilinearly at each output pixel's centre into an image of `size`; outside the image is black."""
    width, height = _check_size(size)
    forward = np.asarray(matrix, np.float64)
    linear = forward[:, :2]
    det = float(np.linalg.det(linear))
    if not np.isfinite(forward).all() or abs(det) < 1e-12:
        raise InvalidFace("the face's transform is degenerate (it maps the image to a line or a point)")
    inverse = np.linalg.inv(linear)             # output -> image
    offset = -inverse @ forward[:, 2]
    # the output's corners in the image, to cut what the output reads (and no more)
    corners = np.array([[0, 0], [width, 0], [0, height], [width, height]], np.float64) @ inverse.T + offset
    # the image pixels per output pixel along the output's axes: box-filter first when that passes 2
    stretch = max(float(np.hypot(*inverse[:, 0])), float(np.hypot(*inverse[:, 1])))
    factor = int(stretch) if stretch >= 2 else 1
    pad = 2 * factor
    x0, y0 = math.floor(corners[:, 0].min()) - pad, math.floor(corners[:, 1].min()) - pad
    x1, y1 = math.ceil(corners[:, 0].max()) + pad, math.ceil(corners[:, 1].max()) + pad
    span_w, span_h = _multiple(x1 - x0, factor), _multiple(y1 - y0, factor)
    if span_w * span_h > 64 * 1024 * 1024:
        raise InvalidFace(f"the face's transform reads {span_w}x{span_h} pixels of the image: a degenerate box or "
                          "landmarks")
    part = image.crop((x0, y0, x0 + span_w, y0 + span_h))  # pads with black outside the image
    if part.mode not in KEPT_MODES:
        part = part.convert("RGB")
    if factor > 1:
        part = part.reduce(factor)
    # output -> part's pixels: (image point - (x0, y0)) / factor
    a = inverse / factor
    c = (offset - (x0, y0)) / factor
    data = (a[0, 0], a[0, 1], c[0], a[1, 0], a[1, 1], c[1])
    return part.transform((width, height), Image.Transform.AFFINE, data, resample=Image.Resampling.BILINEAR)


def check_margin(margin: object) -> float:
    """A box-only crop's margin: a number in [0, MARGIN_MAX] (model.json's face.crop_margin)."""
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= MARGIN_MAX:
        raise InvalidFace(f"a crop margin is a number from 0 to {MARGIN_MAX} (0.2: the crop is 1.2 times the box); "
                          f"got {margin!r:.40}")
    return float(margin)


def _multiple(length: int, factor: int) -> int:
    return -(-length // factor) * factor


def _check_size(size: object) -> Size:
    try:
        width, height = size
    except (TypeError, ValueError):
        raise InvalidFace(f"an embedder's input size is (width, height); got {size!r:.40}") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= INPUT_MAX_SIDE for v in (width, height)):
        raise InvalidFace(f"an embedder's input is 1 to {INPUT_MAX_SIDE} pixels a side; got {size!r:.40}")
    return width, height


def _points(landmarks: object) -> np.ndarray:
    if isinstance(landmarks, np.ndarray):
        landmarks = landmarks.tolist()
    try:
        points = [check_point(p) for p in landmarks]
    except TypeError:
        raise InvalidFace(f"landmarks are (x, y) points; got {landmarks!r:.80}") from None
    return np.asarray(points, np.float64).reshape(-1, 2)
