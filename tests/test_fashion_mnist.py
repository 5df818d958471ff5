"""The committed train-your-own model: served end to end, Edge TPU clean, and rebuilt by its one command."""

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from app.edgetpu.compat import analyze_file
from app.model_dir import read_model_dir
from converter.datasets import load_idx_pair
from converter.fashion_mnist import DATA_DIR, LABELS, TEST_IMAGES
from tests.conftest import MODELS, ROOT

NAME = "fashion_mnist"
MODEL = MODELS / NAME
REBUILD_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def test_set():
    return load_idx_pair(DATA_DIR / TEST_IMAGES)


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def int8_top1(pixels: np.ndarray) -> int:
    """The committed int8 model run directly: the uint8 input tensor is the pixels (scale 1/255, zero point 0)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(read_model_dir(MODEL).file("int8")))
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    assert inp["quantization"] == (1 / 255, 0) or np.isclose(inp["quantization"][0], 1 / 255)
    interpreter.set_tensor(inp["index"], pixels[None, :, :, None])
    interpreter.invoke()
    return int(np.argmax(interpreter.get_tensor(out["index"])[0]))


def test_the_model_directory_is_complete_and_small():
    model = read_model_dir(MODEL)
    manifest = model.manifest
    assert model.labels == tuple(LABELS)
    assert manifest.source.startswith("Fashion-MNIST (Zalando), Debian dataset-fashion-mnist")
    assert manifest.licence == "MIT"
    assert manifest.input.width == manifest.input.height == 28 and manifest.input.channels == 1
    assert manifest.input.resize == "stretch"
    assert manifest.build.command == "python -m converter build fashion_mnist"
    assert model.file("int8").stat().st_size < 400_000
    assert not model.has("edgetpu")  # never compiled here: no compiler on this machine


def test_every_op_maps_to_the_edgetpu():
    report = analyze_file(MODEL / f"{NAME}_int8.tflite")
    assert report.all_mapped and report.summary() == read_model_dir(MODEL).manifest.edgetpu_analysis
    assert {v.opcode for v in report.ops} == {"QUANTIZE", "CONV_2D", "MAX_POOL_2D", "RESHAPE", "FULLY_CONNECTED"}


def test_the_service_classifies_test_images_as_the_model_does(client, test_set):
    images, labels = test_set
    listing = client.get("/v1/models").json()
    assert NAME in {m["name"] for m in listing["models"]}
    correct = 0
    for i in range(20):
        r = client.post(f"/v1/models/{NAME}/classify", params={"top_k": 3}, content=png(images[i]),
                        headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        body = r.json()
        top = body["predictions"][0]
        assert body["model"] == NAME and top["label"] == LABELS[top["index"]]
        assert top["index"] == int8_top1(images[i])  # the service's preprocessing is the model's
        correct += top["index"] == labels[i]
    assert correct >= 17  # ~89% accurate


def test_a_larger_colour_photo_of_a_test_image_is_stretched_and_greyed(client, test_set):
    images, labels = test_set
    big = Image.fromarray(images[0]).resize((112, 112), Image.Resampling.NEAREST).convert("RGB")
    buf = io.BytesIO()
    big.save(buf, "JPEG", quality=95)
    r = client.post(f"/v1/models/{NAME}/classify", content=buf.getvalue(), headers={"content-type": "image/jpeg"})
    assert r.json()["predictions"][0]["label"] == LABELS[labels[0]] == "Ankle boot"


@pytest.mark.slow
def test_the_build_command_reproduces_the_committed_model(tmp_path):
    """`python -m converter build fashion_mnist` in a fresh process (TensorFlow's thread pools are fixed at start)."""
    done = subprocess.run([sys.executable, "-m", "converter", "build", NAME, "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=REBUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    rebuilt = json.loads((tmp_path / NAME / "model.json").read_text())
    committed = json.loads((MODEL / "model.json").read_text())
    assert rebuilt["quality"] == committed["quality"]
    assert rebuilt["files"]["int8"]["sha256"] == committed["files"]["int8"]["sha256"]
    assert (tmp_path / NAME / "labels.txt").read_bytes() == (MODEL / "labels.txt").read_bytes()
