"""app/importing/metadata.py against files TFLite's own metadata writers wrote (tests/data/metadata/,
rebuilt by its make.py with tflite-support 0.4.4), and against files without metadata."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from app.importing.metadata import read_metadata
from tests.classifier_models import tiny_classifier

FIXTURES = Path(__file__).parent / "data" / "metadata"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_the_fixtures_are_the_ones_their_recipe_made():
    for line in (FIXTURES / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256(fixture(name)).hexdigest() == digest, name


def test_an_image_classifiers_metadata_as_the_writer_wrote_it():
    metadata = read_metadata(fixture("classifier_tf1_uint8.tflite"))
    assert metadata.name == "ImageClassifier" and metadata.present
    (image,) = metadata.inputs
    assert (image.name, image.color_space, image.mean, image.std) == ("image", "RGB", (127.5,), (127.5,))
    assert (image.stats_min, image.stats_max) == ((0.0,), (255.0,))
    (scores,) = metadata.outputs
    assert [(f.name, f.type) for f in scores.files] == [("labels.txt", "TENSOR_AXIS_LABELS")]
    assert metadata.packed == {"labels.txt": b"red\ngreen\nblue\nmagenta\n"}


def test_per_channel_normalization_and_the_models_own_facts():
    metadata = read_metadata(fixture("classifier_int8.tflite"))
    assert (metadata.name, metadata.version, metadata.author, metadata.license) == (
        "tiny colours", "v2", "the tests", "Apache-2.0")
    assert metadata.inputs[0].mean == pytest.approx((123.675, 116.28, 103.53))
    assert metadata.inputs[0].std == pytest.approx((58.395, 57.12, 57.375))
    assert metadata.summary()["packed_files"] == ["labels.txt"]


def test_a_detectors_labels_ride_on_its_classes_output():
    metadata = read_metadata(fixture("detector_tf2.tflite"))
    # the writer follows the model's output order (TF2: scores, boxes, count, classes)
    assert [t.name for t in metadata.outputs] == ["score", "location", "number of detections", "category"]
    assert [(f.name, f.type) for f in metadata.label_files(3)] == [("coco_subset.txt", "TENSOR_VALUE_LABELS")]
    assert metadata.label_files()[0].name == "coco_subset.txt"


def test_a_file_without_metadata_and_one_with_only_a_zip():
    plain = tiny_classifier()
    assert not read_metadata(plain).present
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("labels.txt", "a\nb\n")
    packed = read_metadata(plain + archive.getvalue())
    assert packed.present and not packed.inputs and packed.packed == {"labels.txt": b"a\nb\n"}


def test_a_cut_zip_leaves_the_metadata_readable_without_its_files():
    data = fixture("classifier_tf1_uint8.tflite")
    cut = read_metadata(data[:-30])
    assert cut.name == "ImageClassifier" and cut.packed == {}
