"""Pose: MoveNet SinglePose's keypoints -> one person's 17 COCO keypoints in the original image's pixels.

One role, `keypoints`: the model's output [1, 1, 17, 3], each row (y, x, score) with y and x normalized to
the model's input (0..1) and the score 0..1; float32 as MoveNet gives it (its keypoint decoding runs in
the model, on the CPU after the Edge TPU's part), or 8-bit, dequantized (real = scale * (q - zero_point)).
Keypoint k is COCO's k-th (KEYPOINT_NAMES: nose, left_eye, ... right_ankle; labels.txt holds them).

A keypoint goes back to the original image through the geometry the preprocessing used (app/imaging/geometry.py
Geometry: stretch, center crop, letterbox; EXIF orientation applied by decoding), then is clamped to the image
(a point in letterbox padding has no pixel of its own: it lands on the image's edge).

The pose's score is the mean of its 17 keypoint scores, as Coral's pose examples compute it (MoveNet gives no
pose score of its own; Coral's C++ reference files write 1 for it).

No options. Its result (`Poses`): the original image's size, `poses` (one: MoveNet SinglePose finds one person). As named tensors (OIP v2): `keypoints`, FP32 [1, 17, 3], (y, x,
score) normalized to the model's input, as the model gives them (dequantized).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.errors import ModelDirError
from app.imaging.geometry import Geometry
from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task
from app.tasks.results import ImageSize, OriginalImage

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

KEYPOINTS = "keypoints"
# COCO's keypoints, in the order MoveNet (and PoseNet) give them.
KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder", "left_elbow",
    "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
    "right_ankle",
)
# The bones a skeleton draws between keypoints (indices into KEYPOINT_NAMES), as Coral's and TensorFlow's
# MoveNet examples draw them.
SKELETON = (
    (0, 1), (0, 2), (1, 3), (2, 4), (5, 6), (5, 7), (7, 9), (6, 8), (8, 10), (5, 11), (6, 12), (11, 12),
    (11, 13), (13, 15), (12, 14), (14, 16),
)


@dataclass(frozen=True)
class Keypoint:
    name: Annotated[str, Field(description="COCO's keypoint name (labels.txt)")]
    x: Annotated[float, Field(description="in the original image's pixels, as a viewer shows it (EXIF orientation "
                                          "applied)")]
    y: Annotated[float, Field(description="y grows downwards")]
    score: Annotated[float, Field(description="the model's confidence in the keypoint, 0 to 1")]


@dataclass(frozen=True)
class Pose:
    score: Annotated[float, Field(description="the mean of its keypoints' scores")]
    keypoints: Annotated[list[Keypoint], Field(description="COCO's 17 keypoints, in order, whatever their scores")]


@dataclass(frozen=True)
class Poses:
    """The people in the original image and their keypoints."""

    image: OriginalImage
    poses: Annotated[list[Pose], Field(description="MoveNet SinglePose: one")]


class PoseTask(Task, name="pose", verb="pose", summary="Estimate a person's pose"):
    roles = (KEYPOINTS,)

    def read(self, outputs: Outputs, options) -> Poses:
        spec, geometry = outputs.spec(KEYPOINTS), outputs.geometry
        values = keypoint_values(outputs.of(KEYPOINTS), spec.scale, spec.zero_point)
        return Poses(ImageSize(geometry.width, geometry.height), poses(values, geometry, outputs.model_dir.labels))

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        spec = roles.specs[KEYPOINTS]
        expected = (1, 1, len(KEYPOINT_NAMES), 3)
        quantized = spec.dtype.itemsize == 1 and np.issubdtype(spec.dtype, np.integer) and spec.scale > 0
        if tuple(spec.shape) != expected or not (spec.dtype == np.float32 or quantized):
            raise ModelDirError(
                f"model {model_dir.name!r} (pose): its keypoints output {spec.name!r} is {spec.dtype.name} "
                f"{list(spec.shape)}; the service reads MoveNet SinglePose's, float32 (or quantized 8-bit) "
                f"{list(expected)}: (y, x, score) per COCO keypoint")
        if model_dir.labels and len(model_dir.labels) != len(KEYPOINT_NAMES):
            raise ModelDirError(f"model {model_dir.name!r} (pose): labels.txt names {len(model_dir.labels)} "
                                f"keypoints, the model gives {len(KEYPOINT_NAMES)}")

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        return [NamedOutput(KEYPOINTS, np.dtype(np.float32), (1, len(KEYPOINT_NAMES), 3))]

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        spec = outputs.spec(KEYPOINTS)
        values = keypoint_values(outputs.of(KEYPOINTS), spec.scale, spec.zero_point)
        return {KEYPOINTS: values.astype(np.float32).reshape(1, len(KEYPOINT_NAMES), 3)}


TASK = PoseTask()


def keypoint_values(output: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """The output -> [17, 3] float64 (y, x, score), normalized; dequantized when the output is 8-bit."""
    values = output.reshape(-1, 3).astype(np.float64)
    if scale > 0 and np.issubdtype(output.dtype, np.integer):
        values = (values - zero_point) * scale
    return values


def poses(values: np.ndarray, geometry: Geometry, names: Sequence[str] = KEYPOINT_NAMES) -> list[Pose]:
    """(y, x, score) rows normalized to the model's input -> one pose in the original image's pixels."""
    y, x, score = values[:, 0], values[:, 1], values[:, 2]
    px, py = geometry.to_original(x, y)
    px = np.clip(px, 0.0, geometry.width)
    py = np.clip(py, 0.0, geometry.height)
    keypoints = [Keypoint(names[k] if k < len(names) and names[k] else KEYPOINT_NAMES[k], float(a), float(b), float(s))
                 for k, (a, b, s) in enumerate(zip(px.tolist(), py.tolist(), score.tolist()))]
    return [Pose(float(np.mean(score)), keypoints)]
