"""Coral's own segmentation and pose files, imported as downloaded, against Coral's own references: DeepLab v3's
mask of bird_segmentation.bmp (pycoral's tests/segment_test.py: IoU above 0.9) and MoveNet's keypoints of
squat.bmp (libcoral's movenet_test.cc: within 0.04 of movenet_single_pose_*_reference.csv where both scores are
above 0.4), through the service's own preprocessing and decoding, and over a real socket on cpu and emulated; the
emulator byte-exact with TFLite's reference kernels on them, float tail included; PoseNet's and BodyPix's decoder
refused.

The files are not in this repository (nor fetched: the tests run offline), so these tests are deselected by default
(marker `coral_data`, pyproject.toml): `CORAL_TEST_DATA=DIR pytest -m coral_data`, DIR a folder with
google-coral/test_data's files (a clone of it). What is missing there is skipped by name.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from app.model_dir.reading import read_model_dir
from app.tasks import pose, segment
from converter.importer import ImportOptions, ImportRefused, import_model
from tests.conftest import Service
from tests.reference_worker import ReferenceWorker
from tests.test_segpose_models import service_input, tflite

pytestmark = [pytest.mark.slow, pytest.mark.coral_data]

DATA = Path(os.environ.get("CORAL_TEST_DATA", "/nonexistent"))
DEEPLAB = ("deeplabv3_mnv2_dm05_pascal_quant", "deeplabv3_mnv2_pascal_quant")
MOVENET = ("movenet_single_pose_lightning_ptq", "movenet_single_pose_thunder_ptq")
KEYPOINT_TOLERANCE = 0.04   # libcoral's CheckPoseEstimationResults
KEYPOINT_SCORE = 0.4        # the keypoints it checks: both scores above this
MASK_IOU = 0.9              # pycoral's segment_test.py for DeepLab


def needs(*names: str) -> list[Path]:
    paths = [DATA / name for name in names]
    missing = [p.name for p in paths if not p.is_file() or p.stat().st_size < 1024 and p.suffix == ".tflite"]
    if missing:
        pytest.skip(f"CORAL_TEST_DATA ({DATA}) lacks {', '.join(missing)}")
    return paths


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("coral") / "models"


def imported(root: Path, stem: str, labels: str | None = None):
    target = root / stem
    if not target.exists():
        plain, compiled = needs(f"{stem}.tflite", f"{stem}_edgetpu.tflite")
        label_path = needs(labels)[0] if labels else None
        import_model([plain, compiled], ImportOptions(name=stem, out=root, labels=label_path, licence="Apache-2.0"))
    return read_model_dir(target)


def array_iou(a: np.ndarray, b: np.ndarray) -> float:
    """pycoral's tests/segment_test.py array_iou."""
    count = (a == b).sum()
    return count / (a.size + b.size - count)


@pytest.mark.parametrize("stem", DEEPLAB)
def test_deeplab_masks_the_bird_as_coral_does(models_root, stem):
    model_dir = imported(models_root, stem, "pascal_voc_segmentation_labels.txt")
    assert model_dir.manifest.task == "segmentation" and len(model_dir.labels) == 21
    image, reference = needs("bird_segmentation.bmp", "bird_segmentation_mask.bmp")
    tensor, geometry = service_input(model_dir, image.read_bytes())
    cmap = segment.class_map(tflite(model_dir, tensor))
    mask = segment.mask(cmap, segment.sampling(geometry, *cmap.shape), len(model_dir.labels))
    assert array_iou(mask, np.asarray(Image.open(reference))) > MASK_IOU


@pytest.mark.parametrize("stem", MOVENET)
def test_movenet_keypoints_are_coral_reference_keypoints(models_root, stem):
    model_dir = imported(models_root, stem)
    assert model_dir.manifest.task == "pose" and model_dir.manifest.input.mean == [0.0]
    image, reference = needs("squat.bmp", f"{stem}_reference.csv")
    tensor, geometry = service_input(model_dir, image.read_bytes())
    (found,) = pose.poses(pose.keypoint_values(tflite(model_dir, tensor), 0.0, 0), geometry, model_dir.labels)
    check_keypoints([(k.x / geometry.width, k.y / geometry.height, k.score) for k in found.keypoints], reference)


def check_keypoints(found: list[tuple[float, float, float]], reference: Path) -> None:
    """libcoral's CheckPoseEstimationResults: x and y within 0.04 where both scores are above 0.4, for at least
    half the keypoints."""
    rows = list(csv.DictReader(reference.open()))
    checked = 0
    for (x, y, score), row in zip(found, rows, strict=True):
        if float(row["keypoint_score"]) > KEYPOINT_SCORE and score > KEYPOINT_SCORE:
            checked += 1
            assert (x, y) == (pytest.approx(float(row["keypoint_x"]), abs=KEYPOINT_TOLERANCE),
                              pytest.approx(float(row["keypoint_y"]), abs=KEYPOINT_TOLERANCE)), row["keypoint_id"]
    assert checked >= len(rows) // 2


def test_served_on_cpu_and_emulated_as_coral_references_say(models_root):
    deeplab = imported(models_root, DEEPLAB[0], "pascal_voc_segmentation_labels.txt")
    movenet = imported(models_root, MOVENET[0])
    bird, mask, squat, reference = needs("bird_segmentation.bmp", "bird_segmentation_mask.bmp", "squat.bmp",
                                         f"{MOVENET[0]}_reference.csv")
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models_root), "EDGETPU_SERVE_MODELS": f"{deeplab.name},{movenet.name}",
           "EDGETPU_SERVE_BACKENDS": "cpu,emulated", "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=300) as client:
        for backend in ("cpu", "emulated"):
            r = client.post(f"/v1/segment?format=png&backend={backend}", files={"image": bird.read_bytes()})
            assert r.status_code == 200, r.text
            assert array_iou(np.asarray(Image.open(io.BytesIO(r.content))), np.asarray(Image.open(mask))) > MASK_IOU
            answer = client.post(f"/v1/segment?backend={backend}", files={"image": bird.read_bytes()}).json()
            assert [c["label"] for c in answer["classes"]][:2] == ["background", "bird"]
            answer = client.post(f"/v1/pose?backend={backend}", files={"image": squat.read_bytes()}).json()
            size = answer["image"]
            check_keypoints([(k["x"] / size["width"], k["y"] / size["height"], k["score"])
                             for k in answer["poses"][0]["keypoints"]], reference)


@pytest.mark.parametrize(("stem", "photo"), [(DEEPLAB[0], "bird_segmentation.bmp"), (MOVENET[0], "squat.bmp")])
def test_the_emulator_gives_the_reference_kernels_bytes(models_root, stem, photo):
    from app.emulator import Interpreter as Emulator

    model_dir = imported(models_root, stem, "pascal_voc_segmentation_labels.txt" if "deeplab" in stem else None)
    tensor, _ = service_input(model_dir, needs(photo)[0].read_bytes())
    model = model_dir.file("int8").read_bytes()
    emulator = Emulator(model_content=model)
    emulator.allocate_tensors()
    emulator.set_tensor(emulator.get_input_details()[0]["index"], tensor)
    emulator.invoke()
    ours = emulator.get_tensor(emulator.get_output_details()[0]["index"])
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        (theirs,) = reference.run(model, [tensor])
    finally:
        reference.close()
    assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("name", ["posenet/posenet_mobilenet_v1_075_353_481_16_quant_decoder.tflite",
                                  "posenet/bodypix_mobilenet_v1_075_512_512_16_quant_decoder.tflite"])
def test_posenet_and_bodypix_are_refused_for_their_decoder(tmp_path, name):
    (path,) = needs(name)
    with pytest.raises(ImportRefused, match="PosenetDecoderOp"):
        import_model([path], ImportOptions(name="p", out=tmp_path))
