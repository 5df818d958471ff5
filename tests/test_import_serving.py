"""Imported model directories served over a real socket: a plain file on `cpu` and `emulated`, a
compiled-only file (`_edgetpu.tflite` alone) degraded there with the fix, and served on `edgetpu`
through the libedgetpu TEST DOUBLE (which claims the edgetpu-custom-op and fills its output with a
stand-in: the wiring is real, the TPU's numbers are not)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from PIL import Image

from converter.importer import ImportOptions, import_model
from tests.classifier_models import tiny_classifier
from tests.conftest import Service
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.doubles.libedgetpu import DEVICES, INVOKE_LOG, libedgetpu_double  # noqa: F401

LABELS = "red\ngreen\nblue\nmagenta\n"


def colour_png(path, channel: int):
    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[..., channel] = 240
    Image.fromarray(pixels).save(path)
    return path.read_bytes()


@pytest.fixture
def models(tmp_path):
    """models/colours (the plain uint8 file) and models/colours_tpu (its _edgetpu.tflite alone)."""
    plain = tmp_path / "colours.tflite"
    plain.write_bytes(tiny_classifier(style="tf1"))
    compiled = tmp_path / "colours_edgetpu.tflite"
    compiled.write_bytes(compiled_model_bytes(source=plain.read_bytes()))
    labels = tmp_path / "labels.txt"
    labels.write_text(LABELS)
    root = tmp_path / "models"
    import_model([plain], ImportOptions(name="colours", out=root, labels=labels))
    import_model([compiled], ImportOptions(name="colours_tpu", out=root, labels=labels))
    return root


def test_a_compiled_only_model_is_degraded_on_cpu_and_says_how_to_fix_it(models, tmp_path):
    red = colour_png(tmp_path / "red.png", 0)
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
           "EDGETPU_SERVE_DEFAULT_MODEL": "colours", "EDGETPU_SERVE_WORKERS": "1"}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=30) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200  # the service serves: one model lacks a form, the other is whole
        states = ready.json()["models"]
        assert states["colours"]["state"] == "ready"
        tpu_only = states["colours_tpu"]
        assert tpu_only["state"] == "degraded"
        assert tpu_only["error"].startswith("cpu: not served: model 'colours_tpu' has no CPU form")
        assert "emulated: not served" in tpu_only["error"]
        assert "python -m converter import colours.tflite colours_edgetpu.tflite --name colours_tpu" in tpu_only["error"]

        for backend in ("cpu", "emulated"):
            refused = client.post(f"/v1/models/colours_tpu/classify?backend={backend}", files={"image": red})
            assert refused.status_code == 422, refused.text  # BackendNotAvailable, as every backend a model is not served on
            assert "has no CPU form" in refused.json()["error"] and "converter import" in refused.json()["error"]
        default = client.post("/v1/models/colours_tpu/classify", files={"image": red})
        assert default.status_code == 422 and "no CPU form" in default.json()["error"]
        v2 = client.get("/v2/models/colours_tpu")
        assert v2.status_code == 400 and "no CPU form" in v2.json()["error"]  # v2 says 400 where /v1 says 422

        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert listed["colours_tpu"]["backends"] == {} and "no CPU form" in listed["colours_tpu"]["error"]
        assert listed["colours_tpu"]["provenance"]["origin"] == "imported"
        assert listed["colours_tpu"]["provenance"]["files"][0]["name"] == "colours_edgetpu.tflite"

        for backend in ("cpu", "emulated"):  # the plain file serves on both, with the file's labels
            answer = client.post(f"/v1/models/colours/classify?backend={backend}", files={"image": red}).json()
            assert answer["backend"] == backend and answer["predictions"][0]["label"] == "red"
        plain = listed["colours"]
        assert plain["provenance"]["origin"] == "imported" and plain["licence"] == "unknown, given by the user"
        assert plain["source"].startswith("imported: colours.tflite (sha256 ")


def test_a_compiled_only_model_serves_on_edgetpu_through_the_libedgetpu_double(models, tmp_path, libedgetpu_double):
    node = tmp_path / "apex_0"
    node.write_bytes(b"")
    invoked = tmp_path / "invoked.log"
    env = {"EDGETPU_SERVE_MODEL_DIR": str(models), "EDGETPU_SERVE_MODELS": "colours_tpu",
           "EDGETPU_SERVE_DEFAULT_MODEL": "colours_tpu", "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu",
           "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double),
           "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn", DEVICES: f"pci:{node}", INVOKE_LOG: str(invoked)}
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=30) as client:
        model = client.get("/readyz").json()["models"]["colours_tpu"]
        assert model["state"] == "degraded" and model["error"].startswith("cpu: not served: ")
        answer = client.post("/v1/classify", files={"image": colour_png(tmp_path / "red.png", 0)})
        assert answer.status_code == 200, answer.text
        assert answer.json()["backend"] == "edgetpu" and len(answer.json()["predictions"]) == 4
        on_cpu = client.post("/v1/classify?backend=cpu", files={"image": colour_png(tmp_path / "red.png", 0)})
        assert on_cpu.status_code == 422 and "no CPU form" in on_cpu.json()["error"]
    ran = invoked.read_text().splitlines()
    assert ran and all(line.endswith("ops=1 edgetpu-custom-op:uint8>uint8") for line in ran), ran
