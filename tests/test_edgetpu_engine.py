"""EdgeTpuEngine through the real TFLite runtime's load_delegate, with the libedgetpu TEST DOUBLE."""

import numpy as np
import pytest

from app.edgetpu.library import Device
from app.engines import BACKENDS, ENGINES, EngineOptions
from app.engines.cpu import CpuEngine
from app.engines.edgetpu import EdgeTpuEngine, EdgeTpuOptions
from app.edgetpu.errors import EdgeTpuUnavailable
from app.errors import ServeError
from app.model_dir.reading import read_model_dir
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import DEVICES, OPEN, libedgetpu_double, log_delegates  # noqa: F401


@pytest.fixture
def model_dir(tmp_path):
    return read_model_dir(plain_as_compiled(tmp_path / "models") / DEFAULT_MODEL)


@pytest.fixture
def two_tpus(monkeypatch, tmp_path):
    log = tmp_path / "delegate.log"
    monkeypatch.setenv(DEVICES, "usb:/sys/bus/usb/devices/2-1,pci:/dev/apex_0")
    log_delegates(monkeypatch, log)
    return log


def test_registered_under_its_key():
    assert ENGINES["edgetpu"] is EdgeTpuEngine and EdgeTpuEngine.model_file == "edgetpu"


def test_its_own_settings_keep_their_variable_names(monkeypatch, tmp_path):
    for name, value in {"LIBRARY": "/opt/libedgetpu.so.1", "DEVICES": "usb:0, pci", "PERFORMANCE": "High",
                        "ON_FAILURE": "fallback", "VERSION_CHECK": "warn"}.items():
        monkeypatch.setenv(f"EDGETPU_SERVE_EDGETPU_{name}", value)
    monkeypatch.setenv("EDGETPU_SERVE_APEX_SYSFS_DIR", str(tmp_path))  # its first name, kept
    config = BACKENDS["edgetpu"](Settings()).config
    assert (config.library, config.devices, config.performance, config.on_failure, config.version_check,
            config.apex_sysfs_dir) == ("/opt/libedgetpu.so.1", ["usb:0", "pci"], "High", "fallback", "warn", tmp_path)
    given = Settings(plugins={"edgetpu": {"on_failure": "fail"}}).plugin_settings(BACKENDS["edgetpu"])
    assert given.on_failure == "fail" and given.performance == "High"  # in code over the environment


def test_a_wrong_device_spec_stops_the_start_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGETPU_SERVE_EDGETPU_DEVICES", "usb:0,tpu1")
    with pytest.raises(ServeError, match=r"EDGETPU_SERVE_EDGETPU_DEVICES: .*\['tpu1'\]: each device is"):
        Registry(Settings(model_dir=tmp_path))


def test_it_watches_its_interpreters_by_default():
    assert BACKENDS["edgetpu"].watched and not BACKENDS["cpu"].watched


def test_loads_the_edgetpu_file_through_the_delegate_of_the_chosen_tpu(libedgetpu_double, model_dir, two_tpus):
    options = EdgeTpuOptions(library=str(libedgetpu_double), device=":1", tpu=Device("pci", "/dev/apex_0"),
                             performance="High")
    engine = EdgeTpuEngine.load(model_dir.file("edgetpu"), options)
    assert two_tpus.read_text().splitlines() == ["created device=:1 Performance=High"]
    x = np.full(engine.inputs[0].shape, 127, np.uint8)
    cpu = CpuEngine.load(model_dir.file("int8"), EngineOptions())
    # the double's delegate claims no node: the same kernels, the same answer
    assert np.array_equal(engine.run([x])[0], cpu.run([x])[0])


def test_a_tpu_that_will_not_open_is_one_message(libedgetpu_double, model_dir, two_tpus, monkeypatch, tmp_path):
    monkeypatch.setenv(OPEN, "fail")
    gone = Device("pci", str(tmp_path / "apex_0"))  # its node is not in this "container"
    with pytest.raises(EdgeTpuUnavailable) as error:
        EdgeTpuEngine.load(model_dir.file("edgetpu"), EdgeTpuOptions(library=str(libedgetpu_double),
                                                                      device=":1", tpu=gone))
    message = str(error.value)
    assert message.startswith("edgetpu: cannot open the Edge TPU :1")
    assert "Failed to load delegate from" in message and "--device /dev/apex_0" in message


def test_a_spec_the_library_cannot_resolve(libedgetpu_double, model_dir, two_tpus):
    with pytest.raises(EdgeTpuUnavailable, match="cannot open the Edge TPU pci:1"):
        EdgeTpuEngine.load(model_dir.file("edgetpu"), EdgeTpuOptions(library=str(libedgetpu_double), device="pci:1"))
