"""model.json's face fields (app/model_dir/schema.py): an embedder's `face` (crop_margin, calibration) as
app/faces/ reads them, and a face detector's `detection` with the priors decoder, as app/tasks/priors.py decodes it.
The schema sits below app/faces and app/tasks and imports neither, so these tests hold the two to the same rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.faces.align import DEFAULT_MARGIN, MARGIN_MAX, check_margin
from app.faces.confidence import Calibration, CalibrationError
from app.faces.errors import InvalidFace
from app.model_dir.schema import (
    BUILT_IN_ANCHORS,
    CROP_MARGIN_MAX,
    DEFAULT_CROP_MARGIN,
    PRIORS_NMS_IOU,
    PRIORS_VARIANCES,
    DetectionSpec,
    FaceCalibration,
    FaceSpec,
    Manifest,
)
from app.tasks import priors

CALIBRATIONS = [
    {"threshold": 0.35}, {"threshold": 0.35, "same": 0.65, "different": 0.05}, {"threshold": -0.2},
    {"threshold": 0.35, "same": 0.65}, {"threshold": 0.35, "different": 0.05}, {"threshold": 1.0},
    {"threshold": -1.0}, {"threshold": 0.35, "same": 0.3, "different": 0.05}, {"threshold": 0.35, "same": 0.65,
                                                                              "different": 0.4},
    {"threshold": 0.35, "same": 1.0, "different": 0.0}, {"threshold": 0.3, "extra": 1},
    {"threshold": 0.35, "same": 0.35, "different": 0.0}, {"threshold": True}, {"threshold": "0.3"},
]


@pytest.mark.parametrize("document", CALIBRATIONS)
def test_a_calibration_is_valid_in_model_json_exactly_when_app_faces_reads_it(document):
    try:
        Calibration.from_json(document)
        faces_takes = True
    except CalibrationError:
        faces_takes = False
    try:
        FaceCalibration.model_validate(document)
        schema_takes = True
    except ValidationError:
        schema_takes = False
    assert schema_takes == faces_takes, document


@pytest.mark.parametrize("margin", [0, 0.2, 3, 3.01, -0.1, True])
def test_a_crop_margin_is_valid_exactly_when_app_faces_takes_it(margin):
    try:
        check_margin(margin)
        faces_takes = True
    except InvalidFace:
        faces_takes = False
    try:
        FaceSpec(crop_margin=margin)
        schema_takes = True
    except ValidationError:
        schema_takes = False
    assert schema_takes == faces_takes, margin
    assert (DEFAULT_CROP_MARGIN, CROP_MARGIN_MAX) == (DEFAULT_MARGIN, MARGIN_MAX)


def manifest(task: str, **fields) -> dict:
    return {"name": "m", "task": task, "source": "test", "licence": "MIT",
            "input": {"width": 96, "height": 112, "mean": [128], "std": [128]}, **fields}


def test_face_belongs_to_an_embedder_and_round_trips():
    face = {"crop_margin": 0.25, "calibration": {"threshold": 0.4, "same": 0.7, "different": 0.1}}
    model = Manifest.model_validate(manifest("embedding", face=face))
    assert model.face.crop_margin == 0.25 and Calibration.from_json(
        model.face.calibration.model_dump(exclude_none=True)).threshold == 0.4
    assert Manifest.model_validate_json(model.to_json()).face == model.face
    with pytest.raises(ValidationError, match="`face` .* in a model of task 'classification'"):
        Manifest.model_validate(manifest("classification", face=face))
    assert Manifest.model_validate(manifest("embedding")).face is None


def test_the_priors_decoder_takes_its_parameters_and_refuses_the_others():
    spec = DetectionSpec(decoder="priors", box_encoding="decoded", landmarks=5)
    assert (spec.classes, spec.anchors, spec.variances, spec.nms_iou, spec.class_agnostic) == (
        1, "ultra_light", [0.1, 0.2], 0.3, True)
    assert spec.roles == ("boxes", "scores", "landmarks")
    assert DetectionSpec(decoder="priors", box_encoding="priors").roles == ("boxes", "scores")
    for wrong, message in ((dict(), "needs box_encoding"), (dict(box_encoding="priors", classes=2), "one class"),
                           (dict(box_encoding="priors", strides=[8]), "takes no strides"),
                           (dict(box_encoding="priors", score_activation="sigmoid"), "'softmax'"),
                           (dict(box_encoding="priors", variances=[0.1, -1]), "two positive numbers")):
        with pytest.raises(ValidationError, match=message):
            DetectionSpec(decoder="priors", **wrong)
    for decoder in ("postprocess", "yolo_dfl"):
        with pytest.raises(ValidationError, match="takes no box_encoding"):
            DetectionSpec(decoder=decoder, classes=3, box_encoding="priors")
    with pytest.raises(ValidationError, match="score_activation 'softmax' is the priors decoder's"):
        DetectionSpec(decoder="yolo_dfl", classes=3, score_activation="softmax")
    detector = manifest("detection", detection={"decoder": "priors", "box_encoding": "priors"},
                        outputs={"boxes": "a", "scores": "b", "classes": "c"})
    with pytest.raises(ValidationError, match=r"names \['classes'\], roles the 'priors' decoder does not read"):
        Manifest.model_validate(detector)


def test_the_schemas_constants_are_the_decoders():
    assert BUILT_IN_ANCHORS == tuple(priors.BUILT_IN)
    assert PRIORS_NMS_IOU == priors.ULFD_IOU and PRIORS_VARIANCES == (priors.CENTER_VARIANCE, priors.SIZE_VARIANCE)
    assert len(priors.RETINAFACE.for_input(640, 640)) == 16800  # biubug6/Pytorch_Retinaface at 640x640
