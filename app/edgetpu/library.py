"""libedgetpu's C API (edgetpu_c.h) through ctypes: which TPUs are there, which runtime this is.

pycoral answers the same questions through its own compiled extension, built for one
Python and one TFLite release; the C API needs neither, so the service can report
devices and versions even where no pycoral wheel exists (Python 3.11).
"""

from __future__ import annotations

import ctypes
import platform
from dataclasses import dataclass

from app.edgetpu.versions import image_pins
from app.edgetpu.errors import EdgeTpuUnavailable

# The library's file name per platform, as the Edge TPU runtime installs it.
LIBRARY_NAMES = {
    "Linux": "libedgetpu.so.1",
    "Darwin": "libedgetpu.1.dylib",
    "Windows": "edgetpu.dll",
}

# enum edgetpu_device_type
APEX_PCI = 0
APEX_USB = 1
DEVICE_TYPES = {APEX_PCI: "pci", APEX_USB: "usb"}

INSTALL_HINT = (
    "install the libedgetpu of the pinned set (app/edgetpu/versions.toml), e.g. on Debian bookworm the "
    "community build libedgetpu1-{flavor}_{deb}.bookworm_<arch>.deb from github.com/feranick/libedgetpu "
    "release {release} (`apt-get install ./libedgetpu1-{flavor}_*.deb`); for the images, put that .deb in "
    "docker/runtime/ and rebuild (`make images`, docs/images.md); or set EDGETPU_SERVE_EDGETPU_LIBRARY to "
    "the library's path"
)


class _Device(ctypes.Structure):
    # struct edgetpu_device { enum edgetpu_device_type type; const char* path; };
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


@dataclass(frozen=True)
class Device:
    """One TPU as libedgetpu enumerates it: type "usb" or "pci", and its path.

    USB paths are sysfs directories (/sys/bus/usb/devices/2-1), PCIe paths device
    nodes (/dev/apex_0). The index in the list is what the ":N" device spec names.
    """

    type: str
    path: str


def default_library_name() -> str:
    return LIBRARY_NAMES.get(platform.system(), LIBRARY_NAMES["Linux"])


class EdgeTpuLibrary:
    """An opened libedgetpu: list_devices() and version(), each call a fresh answer."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            pins = image_pins()
            raise EdgeTpuUnavailable(
                f"libedgetpu not found: cannot load {path} ({e}). Fix: "
                + INSTALL_HINT.format(deb=pins.libedgetpu_deb_version, release=pins.libedgetpu_release,
                                    flavor=pins.libedgetpu_flavor)
            ) from None
        missing = [name for name in ("edgetpu_list_devices", "edgetpu_free_devices", "edgetpu_version")
                   if not hasattr(self._lib, name)]
        if missing:
            raise EdgeTpuUnavailable(
                f"{path} is not libedgetpu: it lacks {', '.join(missing)} of edgetpu_c.h; "
                "point EDGETPU_SERVE_EDGETPU_LIBRARY at libedgetpu.so.1"
            )
        self._lib.edgetpu_list_devices.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        self._lib.edgetpu_list_devices.restype = ctypes.POINTER(_Device)
        self._lib.edgetpu_free_devices.argtypes = [ctypes.POINTER(_Device)]
        self._lib.edgetpu_free_devices.restype = None
        self._lib.edgetpu_version.argtypes = []
        self._lib.edgetpu_version.restype = ctypes.c_char_p

    def list_devices(self) -> list[Device]:
        """Every TPU the library can see now, in its enumeration order (the ":N" order)."""
        count = ctypes.c_size_t(0)
        array = self._lib.edgetpu_list_devices(ctypes.byref(count))
        if not array:
            return []
        try:
            return [
                Device(DEVICE_TYPES.get(array[i].type, f"unknown({array[i].type})"),
                       (array[i].path or b"").decode("utf-8", "replace"))
                for i in range(count.value)
            ]
        finally:
            self._lib.edgetpu_free_devices(array)

    def version(self) -> str:
        """The runtime's version string, e.g. 'BuildLabel(...), RuntimeVersion(14)'."""
        raw = self._lib.edgetpu_version()
        return raw.decode("utf-8", "replace") if raw else ""
