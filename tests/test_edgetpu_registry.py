"""Start-up policy for the edgetpu backend: each failure kind, with `fail` and with `fallback`.

The libedgetpu TEST DOUBLE stands for the library; the runtime is the real one installed
here (ai-edge-litert), which no pinned set pairs with: tests that are not about the version
check run with EDGETPU_VERSION_CHECK=warn.
"""

import asyncio
import json
import shutil

import numpy as np
import pytest

from app.edgetpu.errors import EdgeTpuUnavailable, EdgeTpuVersionMismatch
from app.errors import BackendNotAvailable, ModelDirError
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.doubles.edgetpu_models import plain_as_compiled, with_edgetpu_file
from tests.doubles.libedgetpu import DEVICES, OPEN, VERSION, libedgetpu_double, log_delegates  # noqa: F401
from tests.pool_requests import run_in


@pytest.fixture
def pci_nodes(tmp_path):
    """Device nodes for PCIe TPUs the double lists: files this process can open."""
    nodes = []
    for i in range(3):
        node = tmp_path / f"apex_{i}"
        node.write_bytes(b"")
        nodes.append(node)
    return nodes


def registry(model_dir, library, policy="fail", check="warn", backends=("edgetpu",), devices=(), **kw) -> Registry:
    edgetpu = dict(library=str(library), on_failure=policy, version_check=check, devices=list(devices))
    reg = Registry(Settings(model_dir=model_dir, backends=list(backends), plugins={"edgetpu": edgetpu}, workers=1,
                            **kw))
    reg.configure()
    return reg


def assert_fell_back(reg: Registry, reason: str) -> None:
    reg.load_all()
    assert reg.ready()
    model = reg.get(DEFAULT_MODEL)
    assert list(model.pools) == ["cpu"] and reason in model.fallback
    status = reg.status(DEFAULT_MODEL)
    assert status.state == "degraded" and status.error.startswith("edgetpu requested, serving on cpu: ")
    assert reason in status.error
    assert reg.default_backend == "cpu"
    with pytest.raises(BackendNotAvailable, match="served on 'cpu' instead of 'edgetpu'"):
        model.pool("edgetpu")


def test_every_tpu_gets_an_interpreter_warmed_up_on_its_own(tmp_path, libedgetpu_double, monkeypatch, pci_nodes):
    monkeypatch.setenv(DEVICES, ",".join(f"pci:{n}" for n in pci_nodes))
    log_delegates(monkeypatch, tmp_path / "log")
    reg = registry(plain_as_compiled(tmp_path / "models"), libedgetpu_double, backends=("edgetpu", "cpu"))
    reg.load_all()
    assert reg.ready() and reg.status(DEFAULT_MODEL).error is None
    pool = reg.get(DEFAULT_MODEL).pool("edgetpu")
    assert [m.device for m in pool.members] == [str(n) for n in pci_nodes]
    assert all(m.first_inference_ms > 0 for m in pool.members)  # one warm-up per TPU
    assert (tmp_path / "log").read_text().splitlines() == [f"created device=:{i}" for i in range(3)]
    assert [m.device for m in reg.members("edgetpu")] == [str(n) for n in pci_nodes]

    async def spread():  # as many requests at once as TPUs: each holds a different one
        x = np.full(pool.members.inputs[0].shape, 127, np.uint8)
        return await asyncio.gather(*(run_in(pool, [x]) for _ in pool.members))

    assert len({r.outputs[0].tobytes() for r in asyncio.run(spread())}) == 1


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_no_library(tmp_path, policy):
    models = plain_as_compiled(tmp_path / "models")
    missing = tmp_path / "libedgetpu.so.1"
    if policy == "fail":
        with pytest.raises(EdgeTpuUnavailable, match="libedgetpu not found"):
            registry(models, missing)
    else:
        assert_fell_back(registry(models, missing, policy), "libedgetpu not found")


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_no_device(tmp_path, libedgetpu_double, monkeypatch, policy):
    monkeypatch.setenv(DEVICES, "")
    models = plain_as_compiled(tmp_path / "models")
    if policy == "fail":
        with pytest.raises(EdgeTpuUnavailable, match="no Edge TPU found"):
            registry(models, libedgetpu_double)
    else:
        assert_fell_back(registry(models, libedgetpu_double, policy), "no Edge TPU found")


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_device_node_not_mapped(tmp_path, libedgetpu_double, monkeypatch, policy):
    monkeypatch.setenv(DEVICES, f"pci:{tmp_path / 'apex_0'}")  # listed by the driver, no node here
    models = plain_as_compiled(tmp_path / "models")
    if policy == "fail":
        with pytest.raises(EdgeTpuUnavailable, match=r"does not exist here\. Fix: .*--device /dev/apex_0"):
            registry(models, libedgetpu_double)
    else:
        assert_fell_back(registry(models, libedgetpu_double, policy), "--device /dev/apex_0")


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_delegate_that_will_not_open(tmp_path, libedgetpu_double, monkeypatch, pci_nodes, policy):
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    monkeypatch.setenv(OPEN, "fail")  # listed and accessible, but the delegate is refused (busy TPU)
    reg = registry(plain_as_compiled(tmp_path / "models"), libedgetpu_double, policy)
    if policy == "fail":
        reg.load_all()
        status = reg.status(DEFAULT_MODEL)
        assert status.state == "failed" and "cannot open the Edge TPU :0" in status.error
        assert not reg.ready()
    else:
        assert_fell_back(reg, "cannot open the Edge TPU :0")


def test_the_fail_policy_fails_the_model_though_another_backend_could_serve_it(tmp_path, libedgetpu_double,
                                                                               monkeypatch, pci_nodes):
    """ON_FAILURE=fail is the plug-in's policy for its TPUs: a delegate that will not open fails the model even with
    cpu configured beside it (where a backend fails for its own reasons, the others serve: test_backend_failure.py)."""
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    monkeypatch.setenv(OPEN, "fail")
    reg = registry(plain_as_compiled(tmp_path / "models"), libedgetpu_double, "fail", backends=("edgetpu", "cpu"))
    reg.load_all()
    status = reg.status(DEFAULT_MODEL)
    assert status.state == "failed" and "cannot open the Edge TPU :0" in status.error
    assert not reg.ready()


def test_unknown_device_spec(tmp_path, libedgetpu_double, monkeypatch, pci_nodes):
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    with pytest.raises(EdgeTpuUnavailable, match="device 'usb:0' names no Edge TPU.*EDGETPU_SERVE_EDGETPU_DEVICES"):
        registry(plain_as_compiled(tmp_path / "models"), libedgetpu_double, devices=["usb:0"])


def test_version_pair_not_pinned(tmp_path, libedgetpu_double, monkeypatch, pci_nodes):
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    # runtime 13 (Coral's older libedgetpu): no set pairs it with ai-edge-litert (14 is the images' pair)
    monkeypatch.setenv(VERSION, "BuildLabel(COMPILER=x), RuntimeVersion(13)")
    models = plain_as_compiled(tmp_path / "models")
    with pytest.raises(EdgeTpuVersionMismatch) as error:
        registry(models, libedgetpu_double, check="strict")
    assert "Edge TPU runtime 13" in str(error.value) and "ai-edge-litert 2.3.0" in str(error.value)
    assert_fell_back(registry(models, libedgetpu_double, "fallback", check="strict"), "not a known-good pair")


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_model_compiled_for_a_newer_runtime(tmp_path, libedgetpu_double, monkeypatch, pci_nodes, policy):
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    monkeypatch.setenv(VERSION, "BuildLabel(COMPILER=x), RuntimeVersion(14)")
    models = with_edgetpu_file(tmp_path / "models", compiled_model_bytes(min_runtime_version=15))
    if policy == "fail":
        with pytest.raises(EdgeTpuVersionMismatch, match=r"runtime 15 or newer.*is runtime 14.*edgetpu_compiler -m 14"):
            registry(models, libedgetpu_double)
    else:
        assert_fell_back(registry(models, libedgetpu_double, policy), "runtime 15 or newer")


@pytest.mark.parametrize("policy", ["fail", "fallback"])
def test_model_not_compiled(tmp_path, libedgetpu_double, monkeypatch, pci_nodes, policy):
    monkeypatch.setenv(DEVICES, f"pci:{pci_nodes[0]}")
    shutil.copytree(MODELS / DEFAULT_MODEL, tmp_path / "models" / DEFAULT_MODEL)  # as committed: int8 only
    if policy == "fail":
        with pytest.raises(ModelDirError, match=r"has no Edge TPU file .*edgetpu_compiler -m 14"):
            registry(tmp_path / "models", libedgetpu_double)
    else:
        assert_fell_back(registry(tmp_path / "models", libedgetpu_double, policy), "has no Edge TPU file")


def test_compiled_model_without_the_delegate_is_one_actionable_message(tmp_path):
    # a compiled file listed as the plain int8 one: the cpu backend hits edgetpu-custom-op
    root = tmp_path / "models"
    with_edgetpu_file(root, compiled_model_bytes())
    target = root / DEFAULT_MODEL
    (target / f"{DEFAULT_MODEL}_int8_edgetpu.tflite").replace(target / f"{DEFAULT_MODEL}_int8.tflite")
    manifest = json.loads((target / "model.json").read_text())
    manifest["files"]["int8"] = dict(manifest["files"].pop("edgetpu"), path=f"{DEFAULT_MODEL}_int8.tflite")
    (target / "model.json").write_text(json.dumps(manifest))
    reg = Registry(Settings(model_dir=root, backends=["cpu"], workers=1))
    reg.configure()
    reg.load_all()
    status = reg.status(DEFAULT_MODEL)
    assert status.state == "failed"
    assert "is compiled for the Edge TPU (it has edgetpu-custom-op nodes), so the cpu backend cannot run it" in status.error
