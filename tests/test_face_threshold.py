"""`python -m converter face-threshold` on a folder of the test people (tests/face_models.py): every photo through
the tiny detector, the crop and the tiny embedder on the service's backends, the threshold printed and written into
the embedder's model.json, where it separates the people on photos it never saw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.faces import Calibration, face_input
from app.tasks.detect import DetectOptions
from converter.__main__ import main
from converter.importer import ImportOptions, import_model
from converter.local_models import LocalModel
from tests.face_models import FACE_SIDE, face_photo, tiny_face_detector, tiny_face_embedder

pytestmark = pytest.mark.slow

PEOPLE = range(8)


def people_folder(root: Path, variants=range(1, 5), seed: int = 0) -> Path:
    """One folder per person, a photo per variant: a 48-pixel face somewhere in a 320x240 scene."""
    rng = np.random.default_rng([seed, 11])
    for k in PEOPLE:
        folder = root / f"person{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for variant in variants:
            left, top = int(rng.integers(0, 320 - FACE_SIDE)), int(rng.integers(0, 240 - FACE_SIDE))
            photo, _ = face_photo([(k, variant, (left, top, FACE_SIDE))], seed=100 * k + variant + seed)
            photo.save(folder / f"{variant}.{'png' if variant % 2 else 'jpg'}")
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("threshold")
    (root / "ulfd.tflite").write_bytes(tiny_face_detector())
    (root / "mfn.tflite").write_bytes(tiny_face_embedder("uint8", "first"))
    import_model([root / "ulfd.tflite"], ImportOptions(name="ulfd", out=root / "models"))
    import_model([root / "mfn.tflite"], ImportOptions(name="mfn", out=root / "models", task="embedding"))
    return root / "models"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def calibration(models: Path) -> dict | None:
    return json.loads((models / "mfn" / "model.json").read_text()).get("face")


def test_the_threshold_is_written_and_separates_people_it_never_saw(models, tmp_path, capsys):
    people = people_folder(tmp_path / "people")
    (people / "person0" / "empty.png").write_bytes(b"")  # unreadable: skipped and said
    face_photo([], seed=3)[0].save(people / "person1" / "nobody.png")  # no face: skipped and said
    code, out, err = run(capsys, "face-threshold", "--models", models, "--detector", "ulfd", "--embedder", "mfn",
                         people)
    assert code == 0, err
    face = calibration(models)
    threshold = face["calibration"]["threshold"]
    assert float(out.strip()) == pytest.approx(threshold, abs=1e-6) and face["crop_margin"] == 0.2
    assert "pairs: 48 same-person, 448 different-person" in err
    assert "overlap: none: every same-person pair scores above every different-person pair" in err
    assert f"skipped {people / 'person0' / 'empty.png'}: not an image Pillow can read" in err
    assert f"skipped {people / 'person1' / 'nobody.png'}: no face found" in err
    assert "person1: 4 of 5 photos with a face" in err and "recorded in" in err
    # photos of the same people it never saw, through the same models and crop: confidence 0.5 separates them
    scale = Calibration.from_json(face["calibration"])
    unseen = people_folder(tmp_path / "unseen", variants=range(5, 8), seed=1)
    vectors = {}
    with LocalModel.open(models / "ulfd") as detector, LocalModel.open(models / "mfn") as embedder:
        for folder in sorted(unseen.iterdir()):
            for path in sorted(folder.iterdir()):
                photo = Image.open(path).convert("RGB")
                (found,) = detector.answer(photo, DetectOptions()).detections
                box = (found.box.x_min, found.box.y_min, found.box.x_max, found.box.y_max)
                vectors.setdefault(folder.name, []).append(
                    embedder.answer(face_input(photo, box, [], (96, 112), 0.2)).embedding)
    for a_name, a in vectors.items():
        for b_name, b in vectors.items():
            for i, u in enumerate(a):
                for v in (b[i + 1:] if a_name == b_name else b):
                    confidence = scale.confidence(float(u @ v))
                    assert (confidence > 0.5) == (a_name == b_name), (a_name, b_name, confidence)


def test_on_the_emulator_and_without_recording(models, tmp_path, capsys):
    people = people_folder(tmp_path / "people", variants=range(1, 3))
    before = (models / "mfn" / "model.json").read_bytes()
    code, out, err = run(capsys, "face-threshold", "--models", models, "--detector", "ulfd", "--embedder", "mfn",
                         "--backend", "emulated", "--no-record", "--false-accept-rate", "0", people)
    assert code == 0, err
    assert "on emulated" in err and "threshold (false accepts <= 0)" in err and "recorded" not in err
    assert (models / "mfn" / "model.json").read_bytes() == before
    assert -1 < float(out) < 1


def test_what_cannot_give_a_threshold_is_refused_with_the_reason(models, tmp_path, capsys):
    people = people_folder(tmp_path / "people", variants=range(1, 3))
    before = calibration(models)
    code, _, err = run(capsys, "face-threshold", "--models", models, "--detector", "mfn", "--embedder", "mfn", people)
    assert code == 1 and "model 'mfn' has task 'embedding'; 'detection' is needed here" in err
    code, _, err = run(capsys, "face-threshold", "--models", models, "--detector", "ulfd", "--embedder", "ulfd", people)
    assert code == 1 and "model 'ulfd' has task 'detection'; 'embedding' is needed here" in err
    lonely = tmp_path / "lonely"
    (lonely / "ann").mkdir(parents=True)
    face_photo([(0, 1, (10, 10, FACE_SIDE))])[0].save(lonely / "ann" / "1.png")
    code, _, err = run(capsys, "face-threshold", "--models", models, "--detector", "ulfd", "--embedder", "mfn", lonely)
    assert code == 1 and "a threshold needs at least two people" in err
    single = tmp_path / "single"
    for k in (0, 1):
        (single / f"p{k}").mkdir(parents=True)
        face_photo([(k, 1, (10, 10, FACE_SIDE))])[0].save(single / f"p{k}" / "1.png")
    code, _, err = run(capsys, "face-threshold", "--models", models, "--detector", "ulfd", "--embedder", "mfn", single)
    assert code == 1 and "no person has two faces" in err
    code, _, err = run(capsys, "face-threshold", "--models", models, "--detector", "nobody", "--embedder", "mfn",
                       people)
    assert code == 1 and "nobody" in err
    assert calibration(models) == before
