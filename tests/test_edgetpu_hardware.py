"""Hardware tests: a real Edge TPU, the real libedgetpu. Deselected by default (-m "not edgetpu").

On a board or a host with a USB Accelerator, with a compiled model in the model directory:

    EDGETPU_TEST_MODEL_DIR=/path/to/models .venv/bin/python -m pytest -m edgetpu -v

Without a TPU these tests fail with the reason; they never pass by skipping.
"""

import os
from pathlib import Path

import httpx
import pytest

from app.engines.edgetpu import EdgeTpuSettings, check_tpus
from app.errors import ServeError
from app.model_dir.reading import discover, read_model_dir
from app.model_dir.schema import EDGETPU
from tests.conftest import MODELS, Service

pytestmark = pytest.mark.edgetpu

MODEL_DIR = Path(os.environ.get("EDGETPU_TEST_MODEL_DIR", MODELS))
TOP_K = 5
MIN_TOP_K_OVERLAP = 4  # the TPU is not bit-exact with the CPU (±1 per value): near-ties may swap


@pytest.fixture(scope="module")
def environment():
    settings = EdgeTpuSettings()  # from EDGETPU_SERVE_EDGETPU_*
    try:
        return check_tpus(settings.library, settings.devices, "strict")
    except ServeError as e:
        pytest.fail(f"these tests need a usable Edge TPU: {e}")


@pytest.fixture(scope="module")
def compiled_model() -> str:
    for name, path in discover(MODEL_DIR).items():
        if read_model_dir(path).has(EDGETPU):
            return name
    pytest.fail(f"no model in {MODEL_DIR} has a compiled '{EDGETPU}' file: compile one with edgetpu_compiler "
                "and point EDGETPU_TEST_MODEL_DIR at its model directory")


def test_libedgetpu_lists_tpus_and_pairs_with_the_runtime(environment):
    assert environment.devices, "libedgetpu lists no TPU"
    assert environment.pinned_set is not None
    assert environment.version.runtime_version == environment.pinned_set.runtime_version


def test_every_tpu_serves_and_agrees_with_the_cpu(environment, compiled_model, cat_png):
    service = Service({"EDGETPU_SERVE_MODEL_DIR": str(MODEL_DIR), "EDGETPU_SERVE_MODELS": compiled_model,
                       "EDGETPU_SERVE_DEFAULT_MODEL": compiled_model, "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu",
                       "EDGETPU_SERVE_WORKERS": "1"})
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            answers = {backend: client.post(f"/v1/classify?backend={backend}&top_k={TOP_K}",
                                            files={"image": cat_png.read_bytes()}).json()
                       for backend in ("edgetpu", "cpu")}
            devices = client.get("/v1/devices").json()["backends"]["edgetpu"]
    finally:
        service.stop()
    tpu, cpu = ({p["index"] for p in answers[b]["predictions"]} for b in ("edgetpu", "cpu"))
    assert answers["edgetpu"]["backend"] == "edgetpu"
    assert answers["edgetpu"]["predictions"][0]["index"] == answers["cpu"]["predictions"][0]["index"]
    assert len(tpu & cpu) >= MIN_TOP_K_OVERLAP
    assert len(devices["devices"]) == len(environment.targets)
    for device in devices["devices"]:
        assert device["health"] == "healthy"
        assert all(i["first_inference_ms"] > 0 for i in device["interpreters"])  # warmed up per TPU
    assert devices["pinned_set"] is not None and devices["error"] is None
