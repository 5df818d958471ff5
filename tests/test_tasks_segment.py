"""app/tasks/segment.py: a class map back to the original image's pixels through every geometry the preprocessing
uses (stretch, center crop, letterbox, a JPEG decoded at reduced scale, EXIF orientation), the classes' fractions,
and the PNG.

The "model" here is perfect and needs no interpreter: its class map is read off the very input tensor the
preprocessing made (red pixels are class 1), so mapped back it must give the red rectangle of the original, to
within the pixels where resampling blurs its edges.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.model_dir.schema import InputSpec
from app.tasks import segment
from tests.test_detect import encode

RED = (220, 20, 30)
LABELS = ("background", "red")


def photo(width: int, height: int, box: tuple[int, int, int, int]) -> np.ndarray:
    pixels = np.full((height, width, 3), 90, np.uint8)
    left, top, right, bottom = box
    pixels[top:bottom, left:right] = RED
    return pixels


def encoded(pixels: np.ndarray, fmt: str = "PNG", orientation: int = 1) -> bytes:
    """What a camera writes for what a viewer shows as `pixels`: stored turned, with its EXIF orientation."""
    return encode(Image.fromarray(pixels), fmt, orientation)


def perfect_segmenter(data: bytes, spec: InputSpec, map_size: int | None = None) -> tuple[np.ndarray, Geometry]:
    """The class map a perfect model would give for the input the service makes of `data` (at map_size, nearest
    sampled, as a stride would give it), and the geometry."""
    image, source = decode_with_source(data, spec, 10**8)
    pixels = to_pixels(image, spec).astype(int)
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100)
    if map_size is not None:
        step = spec.height / map_size
        index = (np.arange(map_size) * step + step / 2).astype(int)
        red = red[np.ix_(index, index)]
    return red.astype(np.int64), Geometry.of(source, image.size, spec)


def spec(resize: str, size: int = 64, crop_fraction: float = 0.875) -> InputSpec:
    return InputSpec(width=size, height=size, resize=resize, crop_fraction=crop_fraction, mean=[0], std=[1])


def disagreement(mask: np.ndarray, truth: np.ndarray, seen: np.ndarray) -> float:
    """The fraction of the seen pixels whose class differs from the truth."""
    return float(((mask != truth) & seen).sum() / max(seen.sum(), 1))


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "center_crop"])
@pytest.mark.parametrize("orientation", [1, 6, 3])
def test_the_mask_is_the_red_region_of_the_original_through_any_geometry(resize, orientation):
    width, height, box = 240, 150, (70, 30, 190, 110)
    original = photo(width, height, box)
    truth = np.zeros((height, width), np.int64)
    truth[box[1]:box[3], box[0]:box[2]] = 1
    cmap, geometry = perfect_segmenter(encoded(original, "PNG", orientation), spec(resize))
    assert (geometry.width, geometry.height) == (width, height)  # upright, as a viewer shows it
    where = segment.sampling(geometry, *cmap.shape)
    mask = segment.mask(cmap, where, len(LABELS))
    assert mask.shape == (height, width) and mask.dtype == np.uint8
    seen = mask != segment.UNSEEN
    assert disagreement(mask, truth, seen) < 0.03
    if resize == "center_crop":  # only the central square holding 0.875 of the shorter side was seen
        crop = height * 0.875
        rows, columns = np.flatnonzero(seen.any(axis=1)), np.flatnonzero(seen.any(axis=0))
        assert columns[0] == pytest.approx((width - crop) / 2, abs=1) and len(columns) == pytest.approx(crop, abs=1)
        assert rows[0] == pytest.approx((height - crop) / 2, abs=1) and len(rows) == pytest.approx(crop, abs=1)
        assert seen.sum() == len(rows) * len(columns) and where.seen == pytest.approx(crop * crop / (width * height),
                                                                                       abs=0.01)
    else:
        assert seen.all() and where.seen == 1


def test_a_jpeg_decoded_at_reduced_scale_maps_to_its_full_size():
    width, height, box = 1600, 1200, (400, 300, 1000, 900)
    cmap, geometry = perfect_segmenter(encoded(photo(width, height, box), "JPEG"), spec("stretch"))
    mask = segment.mask(cmap, segment.sampling(geometry, *cmap.shape), 2)
    truth = np.zeros((height, width), np.int64)
    truth[300:900, 400:1000] = 1
    assert mask.shape == (height, width) and disagreement(mask, truth, np.ones_like(truth, bool)) < 0.03


def test_a_map_coarser_than_the_input_covers_the_same_image():
    width, height, box = 200, 200, (50, 50, 150, 150)
    cmap, geometry = perfect_segmenter(encoded(photo(width, height, box)), spec("stretch", 64), map_size=16)
    assert cmap.shape == (16, 16)
    mask = segment.mask(cmap, segment.sampling(geometry, 16, 16), 2)
    truth = np.zeros((height, width), np.int64)
    truth[50:150, 50:150] = 1
    assert disagreement(mask, truth, np.ones_like(truth, bool)) < 0.03


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "center_crop"])
def test_the_fractions_are_the_masks_exactly(resize):
    width, height, box = 300, 170, (20, 10, 140, 90)
    cmap, geometry = perfect_segmenter(encoded(photo(width, height, box)), spec(resize, 48))
    cmap = cmap + (np.arange(48)[None, :] >= 40)  # a third class on the right edge
    where = segment.sampling(geometry, *cmap.shape)
    mask = segment.mask(cmap, where, 3)
    seen = mask != segment.UNSEEN
    shares = segment.shares(cmap, where, ("background", "red", ""))
    counted = {c: int((mask[seen] == c).sum()) / int(seen.sum()) for c in np.unique(mask[seen]).tolist()}
    assert {s.class_id: s.fraction for s in shares} == pytest.approx(counted, abs=1e-12)
    assert [s.fraction for s in shares] == sorted((s.fraction for s in shares), reverse=True)
    assert {s.label for s in shares} <= {"background", "red", "2"}  # a blank label is named by its id
    assert where.seen == pytest.approx(seen.mean())


def test_scores_become_the_argmax_first_on_a_tie():
    scores = np.array([[[[1, 5, 5], [9, 0, 2]], [[-3, -3, -4], [0, 0, 0]]]], np.int8)
    assert segment.class_map(scores).tolist() == [[1, 0], [0, 0]]
    assert segment.class_map(np.array([[[4, 2], [0, 1]]], np.int64)).tolist() == [[4, 2], [0, 1]]
    assert segment.class_map(np.zeros((1, 2, 3, 1), np.int32)).shape == (2, 3)


def test_the_png_is_one_byte_per_pixel_the_class_id_in_voc_colours():
    mask = np.array([[0, 1, 15], [255, 3, 0]], np.uint8)
    image = Image.open(io.BytesIO(segment.png(mask)))
    assert image.format == "PNG" and image.mode == "P" and image.size == (3, 2)
    assert np.array_equal(np.asarray(image), mask)
    palette = image.getpalette()
    assert palette[15 * 3:16 * 3] == [192, 128, 128] and palette[255 * 3:256 * 3] == [224, 224, 192]
    assert palette[:6] == [0, 0, 0, 128, 0, 0]  # background black, class 1 dark red, as VOC's ground truth


def test_a_model_of_more_than_255_classes_gets_a_16_bit_mask():
    cmap = np.array([[0, 300], [254, 255]], np.int64)
    geometry = Geometry(4, 2, (0.0, 0.0, 4.0, 2.0), (1.0, 1.0))
    mask = segment.mask(cmap, segment.sampling(geometry, 2, 2), 400)
    assert mask.dtype == np.uint16 and mask.tolist() == [[0, 0, 300, 300], [254, 254, 255, 255]]
    image = Image.open(io.BytesIO(segment.png(mask)))
    assert image.mode.startswith("I") and np.array_equal(np.asarray(image), mask)
    # a class id the labels do not reach still gets its own value, never the unseen one
    small = segment.mask(np.array([[255]]), segment.sampling(Geometry(1, 1, (0.0, 0.0, 1.0, 1.0), (1.0, 1.0)), 1, 1), 3)
    assert small.dtype == np.uint16 and small.tolist() == [[255]]


def test_nearest_sampling_puts_each_pixel_on_the_map_cell_its_centre_falls_on():
    # a 10-pixel-wide image on a 4-cell map: centres 0.5..9.5 -> u = 0.05..0.95 -> cells floor(4u)
    geometry = Geometry(10, 1, (0.0, 0.0, 10.0, 1.0), (1.0, 1.0))
    assert segment.sampling(geometry, 1, 4).cols.tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    # letterboxed into the left 60% of the input: the image covers map cells 0..2 of 5
    boxed = Geometry(6, 1, (0.0, 0.0, 6.0, 1.0), (0.6, 1.0))
    assert segment.sampling(boxed, 1, 5).cols.tolist() == [0, 0, 1, 1, 2, 2]
