"""app/faces/align.py: the similarity fit recovers known transforms (and agrees with scikit-image's Umeyama),
the warp samples exactly where the geometry says (ramp images in float mode), the result is OpenCV's
convention, crops hold the box at the embedder's aspect ratio, and large faces are box-filtered first."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from skimage import transform as sk_transform

from app.faces import InvalidFace, cut_region
from app.faces.align import (ARCFACE_112, DEFAULT_MARGIN, Similarity, aligned, alignment, crop_box, cropped,
                             face_input, region_input, similarity_transform, template, warp)

MOBILEFACENET = (96, 112)  # width, height
# SphereFace's / MobileFaceNet's 96x112 template as published (OpenCV pixel indices)
SPHEREFACE_96 = ((30.2946, 51.6963), (65.5318, 51.5014), (48.0252, 71.7366), (33.5493, 92.3655), (62.7299, 92.2041))


def umeyama_by_scikit_image(source, target):
    """scikit-image's SimilarityTransform fitted to the points (from_estimate since 0.26, estimate before)."""
    if hasattr(sk_transform.SimilarityTransform, "from_estimate"):
        fitted = sk_transform.SimilarityTransform.from_estimate(source, target)
    else:
        fitted = sk_transform.SimilarityTransform()
        fitted.estimate(source, target)
    assert fitted
    return fitted


def similarity(scale, degrees, tx, ty) -> np.ndarray:
    a = math.radians(degrees)
    return np.array([[scale * math.cos(a), -scale * math.sin(a), tx], [scale * math.sin(a), scale * math.cos(a), ty]])


def apply(matrix, points):
    points = np.asarray(points, np.float64)
    return points @ matrix[:, :2].T + matrix[:, 2]


def ramps(width, height):
    """Two float images whose pixel values are their own continuous x and y: a bilinear sample returns where
    it was taken, exactly (bilinear interpolation of a linear function is the function)."""
    x = np.tile((np.arange(width) + 0.5).astype(np.float32), (height, 1))
    y = np.tile((np.arange(height) + 0.5).astype(np.float32)[:, None], (1, width))
    return Image.fromarray(x, mode="F"), Image.fromarray(y, mode="F")


def sampled_at(x_image, y_image, transform):
    """Where in the source each output pixel was sampled, as (x, y) arrays."""
    return np.asarray(transform(x_image), np.float64), np.asarray(transform(y_image), np.float64)


def output_centres(width, height):
    gx, gy = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    return np.stack([gx.ravel(), gy.ravel()], 1)


@pytest.mark.parametrize("scale, degrees, tx, ty", [(1.0, 0, 0, 0), (0.37, 23.5, -40.2, 17.9), (2.6, -171, 300, -5),
                                                     (1e-3, 90, 0.5, 0.25)])
def test_a_known_similarity_is_recovered_exactly(scale, degrees, tx, ty):
    points = np.random.default_rng(1).uniform(-50, 400, (5, 2))
    truth = similarity(scale, degrees, tx, ty)
    fit = similarity_transform(points, apply(truth, points))
    np.testing.assert_allclose(fit.matrix, truth, atol=1e-9 * max(1, abs(tx), abs(ty)))
    assert fit.residual < 1e-9 * max(1, scale * 400)
    assert fit.scale == pytest.approx(scale) and fit.angle_degrees == pytest.approx(degrees)


def test_the_least_squares_fit_is_umeyamas_as_scikit_image_computes_it():
    rng = np.random.default_rng(2)
    for _ in range(20):
        points = rng.uniform(0, 300, (5, 2))
        target = apply(similarity(rng.uniform(0.1, 3), rng.uniform(-180, 180), *rng.uniform(-100, 100, 2)), points)
        target += rng.normal(0, 4, target.shape)  # landmarks are never exact
        fit = similarity_transform(points, target)
        reference = umeyama_by_scikit_image(points, target)
        np.testing.assert_allclose(fit.matrix, reference.params[:2], rtol=1e-9, atol=1e-9)
        assert fit.residual == pytest.approx(np.sqrt((reference.residuals(points, target) ** 2).mean()))
        # and no other similarity fits better: a nudge of any of its 4 parameters (a, b, tx, ty of
        # [[a, -b, tx], [b, a, ty]]), either way, costs
        cost = ((fit.apply(points) - target) ** 2).sum()
        a, b, tx, ty = fit.matrix[0, 0], fit.matrix[1, 0], fit.matrix[0, 2], fit.matrix[1, 2]
        for i in range(4):
            for step in (1e-4, -1e-4):
                p = [a, b, tx, ty]
                p[i] += step
                nudged = np.array([[p[0], -p[1], p[2]], [p[1], p[0], p[3]]])
                assert ((apply(nudged, points) - target) ** 2).sum() > cost


def test_a_mirror_image_is_fitted_by_a_rotation_not_a_reflection():
    points = np.asarray(ARCFACE_112)
    mirrored = points * (-1, 1)
    fit = similarity_transform(points, mirrored)
    assert np.linalg.det(fit.matrix[:, :2]) > 0 and fit.residual > 1


def test_the_templates_are_arcfaces_and_spherefaces():
    np.testing.assert_allclose(template((112, 112)), np.asarray(ARCFACE_112) + 0.5)
    np.testing.assert_allclose(template(MOBILEFACENET), np.asarray(SPHEREFACE_96) + 0.5)
    np.testing.assert_allclose(template((224, 224)), (np.asarray(ARCFACE_112) + 0.5) * 2)
    assert template((160, 112))[:, 0].mean() == pytest.approx(template((112, 112))[:, 0].mean() + 24)


def face_landmarks(scale, degrees, centre, size=MOBILEFACENET):
    """Where a face's 5 landmarks are in a photo: the template moved by a known similarity."""
    truth = similarity(scale, degrees, 0, 0)
    points = apply(truth, template(size))
    return points - points.mean(0) + centre, truth


@pytest.mark.parametrize("scale, degrees", [(1.0, 0.0), (1.9, 12.0), (0.6, -35.0), (4.5, 170.0)])
def test_alignment_samples_the_photo_where_the_transform_says(scale, degrees):
    width, height = 640, 480
    landmarks, _ = face_landmarks(scale, degrees, (300.3, 221.7))
    fit = alignment(landmarks, MOBILEFACENET)
    np.testing.assert_allclose(fit.apply(landmarks), template(MOBILEFACENET), atol=1e-9)
    x_image, y_image = ramps(width, height)
    xs, ys = sampled_at(x_image, y_image, lambda image: aligned(image, landmarks, MOBILEFACENET))
    assert xs.shape == (112, 96)
    expected = apply(np.linalg.inv(np.vstack([fit.matrix, [0, 0, 1]]))[:2], output_centres(96, 112))
    edge = 2 * max(1.0, scale)  # a box-filtered photo blends with the black outside over its factor
    inside = (expected > edge).all(1) & (expected[:, 0] < width - edge) & (expected[:, 1] < height - edge)
    assert inside.mean() > 0.5
    got = np.stack([xs.ravel(), ys.ravel()], 1)
    np.testing.assert_allclose(got[inside], expected[inside], atol=2e-3)


def test_alignment_is_opencvs_warp_affine_of_the_same_landmarks():
    """OpenCV's convention (insightface's norm_crop): landmarks and template in pixel indices, each output pixel
    index sampled at the inverse map of that index. scikit-image's warp samples the same way."""
    rng = np.random.default_rng(3)
    photo = rng.uniform(0, 255, (60, 80)).astype(np.float32)
    photo = np.asarray(Image.fromarray(photo, mode="F").resize((320, 240), Image.Resampling.BICUBIC))  # smooth
    landmarks, _ = face_landmarks(0.8, 17.0, (150.2, 120.9))
    ours = np.asarray(aligned(Image.fromarray(photo, mode="F"), landmarks, MOBILEFACENET))
    opencv = umeyama_by_scikit_image(landmarks - 0.5, np.asarray(SPHEREFACE_96))
    theirs = sk_transform.warp(photo.astype(np.float64), opencv.inverse, output_shape=(112, 96), order=1,
                               mode="constant", cval=0.0, preserve_range=True)
    np.testing.assert_allclose(ours[2:-2, 2:-2], theirs[2:-2, 2:-2], atol=1e-3)


@pytest.mark.parametrize("box", [(100.0, 50.0, 160.0, 130.0), (100.0, 50.0, 220.0, 90.0), (10.5, 20.25, 11.5, 21.5)])
@pytest.mark.parametrize("margin", [0.0, DEFAULT_MARGIN, 1.0])
def test_the_crop_holds_the_box_at_the_inputs_aspect_ratio(box, margin):
    left, top, right, bottom = crop_box(box, MOBILEFACENET, margin)
    assert (right - left) / (bottom - top) == pytest.approx(96 / 112)
    assert ((left + right) / 2, (top + bottom) / 2) == pytest.approx(((box[0] + box[2]) / 2, (box[1] + box[3]) / 2))
    # the smallest rectangle holding the box, times 1 + margin: one side is the box's side times that
    sides = ((right - left) / (box[2] - box[0]), (bottom - top) / (box[3] - box[1]))
    assert min(sides) == pytest.approx(1 + margin)


@pytest.mark.parametrize("box", [(100.0, 50.0, 160.0, 130.0), (-30.0, -20.0, 41.0, 77.0), (5.0, 5.0, 600.0, 470.0)])
def test_the_crop_samples_exactly_its_rectangle(box):
    x_image, y_image = ramps(640, 480)
    xs, ys = sampled_at(x_image, y_image, lambda image: cropped(image, box, MOBILEFACENET))
    left, top, right, bottom = crop_box(box, MOBILEFACENET)
    centres = output_centres(96, 112)
    expected_x = left + centres[:, 0] * (right - left) / 96
    expected_y = top + centres[:, 1] * (bottom - top) / 112
    edge = 2 * max(1.0, (right - left) / 96)  # a box-filtered photo blends with the black outside over its factor
    inside = (expected_x > edge) & (expected_x < 640 - edge) & (expected_y > edge) & (expected_y < 480 - edge)
    assert inside.sum() > 1000
    np.testing.assert_allclose(xs.ravel()[inside], expected_x[inside], atol=2e-3)
    np.testing.assert_allclose(ys.ravel()[inside], expected_y[inside], atol=2e-3)
    outside = (expected_x < -edge) | (expected_x > 640 + edge) | (expected_y < -edge) | (expected_y > 480 + edge)
    assert (xs.ravel()[outside] == 0).all()  # outside the photo is black


def test_a_large_face_is_box_filtered_before_the_bilinear_step():
    """1-pixel stripes seen 10 times smaller: a bilinear sample alone reads 4 of each 100 pixels and shows stripes
    or a flat 0 or 255; filtered first, every output pixel is the stripes' mean."""
    stripes = np.zeros((2000, 2000), np.uint8)
    stripes[:, ::2] = 255
    photo = Image.fromarray(stripes, mode="L")
    out = np.asarray(cropped(photo, (500.5, 400.0, 1460.5, 1520.0), MOBILEFACENET, margin=0.0), np.float64)
    assert out.shape == (112, 96)
    assert np.abs(out - 127.5).max() <= 1.0
    naive = np.asarray(photo.transform((96, 112), Image.Transform.AFFINE, (10, 0, 500.5, 0, 10, 400),
                                       resample=Image.Resampling.BILINEAR), np.float64)
    assert np.abs(naive - 127.5).min() > 100  # what the filtering prevents: every sample on one stripe


def test_face_input_aligns_with_five_landmarks_and_crops_without():
    rng = np.random.default_rng(4)
    photo = Image.fromarray(rng.integers(0, 256, (240, 320, 3), np.uint8))
    landmarks, _ = face_landmarks(0.7, 5.0, (160.0, 120.0))
    box = (120.0, 80.0, 200.0, 170.0)
    assert face_input(photo, box, landmarks, MOBILEFACENET).tobytes() == aligned(photo, landmarks,
                                                                                 MOBILEFACENET).tobytes()
    assert face_input(photo, box, (), MOBILEFACENET).tobytes() == cropped(photo, box, MOBILEFACENET).tobytes()
    assert face_input(photo, box, landmarks, MOBILEFACENET).mode == "RGB"


def test_the_gallerys_region_gives_the_input_the_photo_gives():
    """The region keeps the box and landmarks in its own pixels: the same face, from the region (JPEG q95, not
    scaled here: a face under 224 pixels) or from the photo, differs only by the JPEG's noise."""
    rng = np.random.default_rng(5)
    small = rng.integers(0, 256, (30, 40, 3), np.uint8)
    photo = Image.fromarray(small).resize((640, 480), Image.Resampling.BICUBIC)  # smooth: JPEG keeps it well
    landmarks, _ = face_landmarks(1.1, -8.0, (300.0, 250.0))
    box = (250.0, 180.0, 360.0, 320.0)
    region = cut_region(photo, box, landmarks)
    for points, stored in ((landmarks, region), ((), replace(region, landmarks=()))):
        from_photo = np.asarray(face_input(photo, box, points, MOBILEFACENET), np.float64)
        from_region = np.asarray(region_input(stored, MOBILEFACENET), np.float64)
        assert np.abs(from_photo - from_region).mean() < 2.0


def test_modes_other_than_rgb_l_and_f_become_rgb():
    photo = Image.new("P", (100, 100), 3)
    assert cropped(photo, (10, 10, 60, 70), MOBILEFACENET).mode == "RGB"
    assert cropped(photo.convert("RGBA"), (10, 10, 60, 70), MOBILEFACENET).mode == "RGB"
    assert cropped(photo.convert("L"), (10, 10, 60, 70), MOBILEFACENET).mode == "L"


@pytest.mark.parametrize("call, message", [
    (lambda: alignment([(1, 2)] * 4, MOBILEFACENET), "takes 5 landmarks"),
    (lambda: alignment([(1, 2)] * 5, MOBILEFACENET), "all at one point"),
    (lambda: alignment([(1, 2), (3, float("nan")), (5, 6), (7, 8), (9, 1)], MOBILEFACENET), "finite"),
    (lambda: alignment([(1, 2, 3)] * 5, MOBILEFACENET), "two numbers"),
    (lambda: alignment(7, MOBILEFACENET), r"\(x, y\) points"),
    (lambda: alignment(np.asarray(ARCFACE_112), (0, 112)), "1 to 1024 pixels"),
    (lambda: alignment(np.asarray(ARCFACE_112), (96.0, 112)), "1 to 1024 pixels"),
    (lambda: alignment(np.asarray(ARCFACE_112), 112), r"\(width, height\)"),
    (lambda: crop_box((10, 10, 5, 20), MOBILEFACENET), "right > left"),
    (lambda: crop_box((10, 10, 20, 20), MOBILEFACENET, margin=-0.1), "crop margin"),
    (lambda: crop_box((10, 10, 20, 20), MOBILEFACENET, margin=True), "crop margin"),
    (lambda: similarity_transform(np.zeros((5, 2)), np.zeros((4, 2))), "same number"),
    (lambda: warp(Image.new("RGB", (8, 8)), np.zeros((2, 3)), MOBILEFACENET), "degenerate"),
    (lambda: warp(Image.new("RGB", (8, 8)), np.array([[1e-6, 0, 0], [0, 1e-6, 0]]), MOBILEFACENET), "reads"),
])
def test_bad_faces_say_what_is_wrong(call, message):
    with pytest.raises(InvalidFace, match=message):
        call()


def test_similarity_records_apply():
    s = Similarity(similarity(2.0, 90.0, 1.0, 0.0))
    np.testing.assert_allclose(s.apply([[1.0, 0.0]]), [[1.0, 2.0]], atol=1e-12)
