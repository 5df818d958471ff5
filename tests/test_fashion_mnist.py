"""The committed train-your-own model: served end to end, Edge TPU clean, and rebuilt by its one command."""

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.edgetpu.compat import analyze_file
from app.model_dir.reading import read_model_dir
from converter.datasets import load_idx_pair
from converter.fashion_mnist import DATA_DIR, LABELS, TEST_IMAGES
from converter.writing import cpu_kind, same_cpu_kind
from tests.conftest import MODELS, ROOT

NAME = "fashion_mnist"
MODEL = MODELS / NAME
REBUILD_TIMEOUT_S = 600
# Across kinds of CPU: top-1 (float and int8) within this many points of the committed figures ...
QUALITY_TOLERANCE_POINTS = 1.5
# ... and int8 agreeing with float on at least this share of the 10,000 test images.
MIN_AGREEMENT = 0.99


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


def build(out: Path) -> dict:
    """`python -m converter build fashion_mnist` in a fresh process (TensorFlow's thread pools are fixed at start)."""
    done = subprocess.run([sys.executable, "-m", "converter", "build", NAME, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=REBUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / NAME / "model.json").read_text())


@pytest.mark.slow
def test_the_build_command_reproduces_the_committed_model(tmp_path):
    """Training is bit-reproducible on one kind of CPU only (seeds, deterministic ops and fixed thread counts do not
    make an AVX-512 machine sum in an AVX2 one's order). So: on the committed build's kind of CPU the rebuild is the
    committed bytes; on another kind, two rebuilds are the same bytes as each other, and the model is as good as the
    committed one within QUALITY_TOLERANCE_POINTS, its int8 agreeing with its float on MIN_AGREEMENT of the test set.
    Slow (about 2 minutes on 2 cores): TensorFlow trains the CNN on 60,000 images for 5 epochs in each rebuild."""
    committed = json.loads((MODEL / "model.json").read_text())
    rebuilt = build(tmp_path / "first")
    assert (tmp_path / "first" / NAME / "labels.txt").read_bytes() == (MODEL / "labels.txt").read_bytes()
    assert rebuilt["build"]["cpu"] == cpu_kind()
    if same_cpu_kind(rebuilt["build"]["cpu"], committed["build"]["cpu"]):
        assert rebuilt["files"]["int8"]["sha256"] == committed["files"]["int8"]["sha256"]
        assert rebuilt["quality"] == committed["quality"]
    else:
        again = build(tmp_path / "second")
        assert again["files"]["int8"]["sha256"] == rebuilt["files"]["int8"]["sha256"]
        assert again["quality"] == rebuilt["quality"]
    evaluation, reference = rebuilt["quality"]["evaluation"], committed["quality"]["evaluation"]
    for kind in ("float", "int8"):
        assert abs(evaluation[kind]["top1"] - reference[kind]["top1"]) * 100 <= QUALITY_TOLERANCE_POINTS, kind
    assert evaluation["top1_agreement"] >= MIN_AGREEMENT


def test_the_committed_build_names_its_kind_of_cpu():
    """What the reproducibility test keys on; x86-64 with AVX2 and FMA, and no AVX-512, made the committed bytes."""
    recorded = json.loads((MODEL / "model.json").read_text())["build"]["cpu"]
    assert recorded["machine"] == "x86_64" and "avx2" in recorded["isa"].split()
    assert "avx512f" not in recorded["isa"].split()


def test_the_cpu_kind_is_read_from_cpuinfo(tmp_path):
    avx512 = tmp_path / "cpuinfo"
    avx512.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f "
                      "avx512_vnni\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n")
    kind = cpu_kind(avx512)
    assert kind["model"] == "AMD EPYC 9R14" and kind["isa"] == "sse4_2 avx avx2 fma avx512f avx512_vnni"
    avx2 = dict(kind, model="AMD EPYC", isa="sse4_2 avx avx2 fma")
    assert not same_cpu_kind(kind, avx2)
    assert same_cpu_kind(avx2, dict(avx2, model="masked by the hypervisor"))
    assert not same_cpu_kind(avx2, None)
    assert cpu_kind(tmp_path / "absent") == {"machine": kind["machine"], "model": "", "isa": ""}
