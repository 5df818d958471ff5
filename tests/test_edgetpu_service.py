"""`python -m app` on a real socket with EDGETPU_SERVE_BACKENDS=edgetpu, on this machine without a TPU,
and with the libedgetpu TEST DOUBLE standing for two PCIe TPUs."""

import re
import subprocess
import sys

import httpx

from tests.conftest import DEFAULT_MODEL, ROOT, Service
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import DEVICES, INVOKE_LOG, libedgetpu_double  # noqa: F401

START_TIMEOUT_S = 60


def test_without_a_tpu_policy_fail_exits_with_one_message():
    env = {"EDGETPU_SERVE_BACKENDS": "edgetpu", "EDGETPU_SERVE_PORT": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("edgetpu-serve: cannot start: ")]
    assert len(lines) == 1, done.stderr
    assert ("libedgetpu not found" in lines[0] or "no Edge TPU found" in lines[0]) and "Fix: " in lines[0]


def test_without_a_tpu_policy_fallback_serves_on_cpu_and_says_so(cat_png):
    service = Service({"EDGETPU_SERVE_BACKENDS": "edgetpu", "EDGETPU_SERVE_EDGETPU_ON_FAILURE": "fallback",
                       "EDGETPU_SERVE_WORKERS": "1"})
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            ready = client.get("/readyz").json()["models"][DEFAULT_MODEL]
            assert ready["state"] == "degraded" and ready["error"].startswith("edgetpu requested, serving on cpu: ")
            answer = client.post("/v1/classify", files={"image": cat_png.read_bytes()}).json()
            assert answer["backend"] == "cpu" and answer["predictions"][0]["label"] == "tiger cat"
            models = client.get("/v1/models").json()
            assert models["default_backend"] == "cpu"
            model = models["models"][0]
            assert list(model["backends"]) == ["cpu"] and "edgetpu requested" in model["error"]
            refused = client.post("/v1/classify?backend=edgetpu", files={"image": cat_png.read_bytes()})
            assert refused.status_code == 422 and "instead of 'edgetpu'" in refused.json()["error"]
            devices = client.get("/v1/devices").json()["backends"]["edgetpu"]
            assert devices["devices"] == [] and devices["error"]
    finally:
        service.stop()


def test_two_tpus_through_the_test_double_compute_what_the_cpu_does(tmp_path, libedgetpu_double, cat_png):
    """The double's delegate claims the model's uint8/int8 QUANTIZE operators (those XNNPACK, applied too,
    leaves it) and computes them itself, so an edgetpu request runs a delegated kernel on one of the two devices
    (logged), a cpu request none, and the answers agree (tests/test_libedgetpu_double.py checks the
    delegated arithmetic itself, tensor for tensor)."""
    nodes = [tmp_path / "apex_0", tmp_path / "apex_1"]
    for node in nodes:
        node.write_bytes(b"")
    invoked = tmp_path / "invoked.log"
    service = Service({
        "EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(tmp_path / "models")),
        "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu", "EDGETPU_SERVE_WORKERS": "1",
        "EDGETPU_SERVE_PROCESSES": "1",  # one process, its pool over both TPUs (several: tests/test_processes.py)
        "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
        DEVICES: ",".join(f"pci:{node}" for node in nodes), INVOKE_LOG: str(invoked),
    })
    try:
        service.wait_ready()
        invocations = lambda: invoked.read_text().splitlines() if invoked.exists() else []  # noqa: E731
        with httpx.Client(base_url=service.url, timeout=30) as client:
            warm_up = invocations()
            assert {line.split()[1] for line in warm_up} == {"device=:0", "device=:1"}  # each TPU warmed up
            on_tpu = client.post("/v1/classify?backend=edgetpu&top_k=1000", files={"image": cat_png.read_bytes()}).json()
            after_tpu = invocations()
            on_cpu = client.post("/v1/classify?backend=cpu&top_k=1000", files={"image": cat_png.read_bytes()}).json()
            after_cpu = invocations()
            assert on_tpu["backend"] == "edgetpu" and on_tpu["predictions"] == on_cpu["predictions"]
            ran = after_tpu[len(warm_up):]  # one inference, on one device, through its delegate
            assert ran and all(re.fullmatch(r"invoked device=:[01] ops=1 QUANTIZE:u?int8>u?int8", r) for r in ran)
            assert len({r.split()[1] for r in ran}) == 1, ran
            assert after_cpu == after_tpu  # the cpu backend never touches the delegate
            devices = client.get("/v1/devices").json()["backends"]["edgetpu"]
    finally:
        service.stop()
    assert [(d["index"], d["type"], d["path"], d["health"]) for d in devices["devices"]] == [
        (0, "pci", str(nodes[0]), "healthy"), (1, "pci", str(nodes[1]), "healthy")]
    for device in devices["devices"]:
        (interpreter,) = device["interpreters"]
        assert interpreter["model"] == DEFAULT_MODEL and interpreter["first_inference_ms"] > 0
    assert devices["library"]["runtime_version"] == 14 and devices["library"]["loaded"]
    assert devices["tflite_runtime"]["name"] == "ai-edge-litert"
    # the double says RuntimeVersion(14) and has no Debian package: the images' pair (versions.toml)
    assert devices["pinned_set"]["name"] == "feranick-tf2.17.1-litert" and devices["error"] is None

