"""app/tasks/pose.py: keypoints normalized to the model's input back to the original image's pixels through every
geometry the preprocessing uses (stretch, center crop, letterbox, EXIF orientation), dequantized when 8-bit, with
COCO's names and the pose's score.

The "model" here is perfect and needs no interpreter: every keypoint is the centre of the white disc in the very
input tensor the preprocessing made, so mapped back it must land on the disc's centre in the original.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.model_dir.schema import InputSpec
from app.tasks import pose
from tests.pose_models import disc_image
from tests.test_tasks_segment import encoded


def perfect_keypoints(data: bytes, spec: InputSpec) -> tuple[np.ndarray, Geometry]:
    """17 rows (y, x, score): the centre of the white in the input the service makes of `data`, normalized."""
    image, source = decode_with_source(data, spec, 10**8)
    white = to_pixels(image, spec)[..., 0].astype(np.float64)
    ys, xs = np.mgrid[0:spec.height, 0:spec.width] + 0.5
    y, x = (white * ys).sum() / white.sum() / spec.height, (white * xs).sum() / white.sum() / spec.width
    return np.tile([y, x, 0.9], (17, 1)), Geometry.of(source, image.size, spec)


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "center_crop"])
@pytest.mark.parametrize("orientation", [1, 8])
def test_keypoints_land_where_the_disc_is_in_the_original(resize, orientation):
    width, height, cx, cy = 320, 200, 190.0, 90.0
    data = encoded(disc_image(width, height, cx, cy, 30), "PNG", orientation)
    values, geometry = perfect_keypoints(data, InputSpec(width=96, height=96, resize=resize, mean=[0], std=[1]))
    (found,) = pose.poses(values, geometry)
    assert len(found.keypoints) == 17 and [k.name for k in found.keypoints] == list(pose.KEYPOINT_NAMES)
    for keypoint in found.keypoints:
        assert (keypoint.x, keypoint.y) == (pytest.approx(cx, abs=1.5), pytest.approx(cy, abs=1.5))
    assert found.score == pytest.approx(0.9)


def test_8_bit_keypoints_are_dequantized_and_the_pose_score_is_their_mean():
    q = np.zeros((1, 1, 17, 3), np.int8)
    q[..., 0], q[..., 1] = 0, 64          # y 0.5, x 0.75 at scale 1/128, zero point -64
    q[0, 0, :, 2] = np.arange(17) * 4 - 64  # scores 0 .. 0.5
    values = pose.keypoint_values(q, 1 / 128, -64)
    assert values[0].tolist() == [0.5, 1.0, 0.0] and values[16, 2] == pytest.approx(0.5)
    geometry = Geometry(200, 100, (0.0, 0.0, 200.0, 100.0), (1.0, 1.0))
    (found,) = pose.poses(values, geometry)
    assert (found.keypoints[3].x, found.keypoints[3].y) == (200.0, 50.0)
    assert found.score == pytest.approx(np.mean(np.arange(17) * 4 / 128))
    assert pose.keypoint_values(np.ones((1, 1, 17, 3), np.float32), 0.0, 0).tolist() == [[1.0] * 3] * 17


def test_a_keypoint_in_the_letterbox_padding_is_clamped_to_the_image():
    geometry = Geometry(100, 50, (0.0, 0.0, 100.0, 50.0), (1.0, 0.5))  # letterboxed: the image fills the top half
    values = np.tile([0.9, 0.2, 0.5], (17, 1))
    (found,) = pose.poses(values, geometry)
    assert (found.keypoints[0].x, found.keypoints[0].y) == (pytest.approx(20.0), 50.0)


def test_labels_rename_keypoints_and_the_skeleton_joins_coco_keypoints():
    geometry = Geometry(10, 10, (0.0, 0.0, 10.0, 10.0), (1.0, 1.0))
    names = [f"k{i}" for i in range(17)]
    assert pose.poses(np.zeros((17, 3)), geometry, names)[0].keypoints[5].name == "k5"
    assert pose.poses(np.zeros((17, 3)), geometry, ("",) * 17)[0].keypoints[5].name == "left_shoulder"
    assert {i for bone in pose.SKELETON for i in bone} == set(range(17))
