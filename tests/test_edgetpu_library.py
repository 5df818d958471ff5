"""The ctypes layer against the libedgetpu TEST DOUBLE (a C library built by the tests)."""

import ctypes

import pytest

from app.edgetpu import library as library_module
from app.edgetpu.library import Device, EdgeTpuLibrary, default_library_name
from app.edgetpu.versions import parse_runtime_version
from app.edgetpu.errors import EdgeTpuUnavailable
from tests.doubles.libedgetpu import DEVICES, RUNTIME_14, VERSION, libedgetpu_double  # noqa: F401


def live_lists(path) -> int:
    """The double counts lists edgetpu_list_devices handed out and edgetpu_free_devices took back."""
    return ctypes.CDLL(str(path)).edgetpu_test_double_live_device_lists()


@pytest.mark.parametrize("listed, expected", [
    ("", []),
    ("usb:/sys/bus/usb/devices/2-1", [Device("usb", "/sys/bus/usb/devices/2-1")]),
    ("usb:/sys/bus/usb/devices/2-1,pci:/dev/apex_0,usb:/sys/bus/usb/devices/4-2",
     [Device("usb", "/sys/bus/usb/devices/2-1"), Device("pci", "/dev/apex_0"),
      Device("usb", "/sys/bus/usb/devices/4-2")]),
], ids=["no device", "one device", "several devices"])
def test_list_devices_reads_every_struct_and_frees_the_list(libedgetpu_double, monkeypatch, listed, expected):
    monkeypatch.setenv(DEVICES, listed)
    library = EdgeTpuLibrary(str(libedgetpu_double))
    assert library.list_devices() == expected
    assert library.list_devices() == expected  # a fresh answer each call
    assert live_lists(libedgetpu_double) == 0


def test_the_device_list_follows_the_hardware_between_calls(libedgetpu_double, monkeypatch):
    library = EdgeTpuLibrary(str(libedgetpu_double))
    monkeypatch.setenv(DEVICES, "usb:/sys/bus/usb/devices/2-1")
    assert len(library.list_devices()) == 1
    monkeypatch.setenv(DEVICES, "")  # unplugged
    assert library.list_devices() == []


def test_version_is_edgetpu_version_verbatim(libedgetpu_double, monkeypatch):
    monkeypatch.setenv(VERSION, RUNTIME_14)
    text = EdgeTpuLibrary(str(libedgetpu_double)).version()
    assert text == RUNTIME_14
    assert parse_runtime_version(text) == 14
    assert parse_runtime_version("BuildLabel(COMPILER=6.3.0 20170516,DATE=redacted), RuntimeVersion(13)") == 13
    assert parse_runtime_version("no version here") is None


def test_a_missing_library_is_one_message_with_the_fix(tmp_path):
    with pytest.raises(EdgeTpuUnavailable) as error:
        EdgeTpuLibrary(str(tmp_path / "libedgetpu.so.1"))
    message = str(error.value)
    assert message.startswith("libedgetpu not found: cannot load")
    assert "16.0tf2.17.1-1" in message and "EDGETPU_SERVE_EDGETPU_LIBRARY" in message


def test_a_library_that_is_not_libedgetpu_is_refused():
    with pytest.raises(EdgeTpuUnavailable, match="is not libedgetpu: it lacks edgetpu_list_devices"):
        EdgeTpuLibrary("libm.so.6")


@pytest.mark.parametrize("system, name", [("Linux", "libedgetpu.so.1"), ("Darwin", "libedgetpu.1.dylib"),
                                          ("Windows", "edgetpu.dll")])
def test_library_name_per_platform(monkeypatch, system, name):
    monkeypatch.setattr(library_module.platform, "system", lambda: system)
    assert default_library_name() == name
