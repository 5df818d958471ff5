"""The Edge TPU delegate's options, and which listed TPU a `device` spec names.

libedgetpu's `device` option (pycoral's make_interpreter documents the same forms):
    ""          any TPU
    ":N"        the N-th TPU of any type, in edgetpu_list_devices() order
    "usb"       any USB Accelerator          "usb:N"  the N-th USB one
    "pci"       any PCIe TPU (Dev Board)     "pci:N"  the N-th PCIe one
`Performance` (Low, Medium, High, Max; the library's default is Max) is forwarded to the
device only with an indexed form, so the service always opens a TPU by ":N".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.edgetpu.library import Device

DEVICE_SPEC = re.compile(r"^(?P<type>usb|pci)?(?::(?P<index>\d+))?$")
PERFORMANCE = ("Low", "Medium", "High", "Max")


@dataclass(frozen=True)
class Target:
    """One TPU to open: what was asked for, the device it resolved to, its index now."""

    requested: str
    device: Device
    index: int

    @property
    def spec(self) -> str:
        return f":{self.index}"

    @property
    def label(self) -> str:
        return f"{self.device.type}:{self.device.path}"


def is_device_spec(spec: str) -> bool:
    return DEVICE_SPEC.match(spec) is not None


def resolve(spec: str, devices: list[Device]) -> int | None:
    """Index in `devices` of the TPU the spec names, by libedgetpu's rules; None if none."""
    found = DEVICE_SPEC.match(spec)
    if found is None:
        raise ValueError(f"device spec {spec!r} is not one of '', ':N', 'usb', 'usb:N', 'pci', 'pci:N'")
    wanted_type, index = found.group("type"), found.group("index")
    candidates = [i for i, d in enumerate(devices) if wanted_type is None or d.type == wanted_type]
    if index is None:
        return candidates[0] if candidates else None
    index = int(index)
    return candidates[index] if index < len(candidates) else None


def resolve_targets(requested: list[str], devices: list[Device]) -> list[Target]:
    """One target per requested spec (every listed TPU when none is requested).

    Raises ValueError naming the spec that matches no TPU, or two specs that name the same one.
    """
    targets, missing = resolve_present(requested, devices)
    if missing:
        listed = ", ".join(f":{i} {d.type} {d.path}" for i, d in enumerate(devices)) or "none"
        raise ValueError(f"device {missing[0]!r} names no Edge TPU; libedgetpu lists: {listed}")
    return targets


def resolve_present(requested: list[str], devices: list[Device]) -> tuple[list[Target], list[str]]:
    """For TPUs that come and go: a target for each requested spec that names a listed TPU (every listed
    TPU when none is requested), and the specs that name none now, whose TPU may be plugged in later.

    Raises ValueError when two specs name the same TPU: one interpreter per TPU.
    """
    if not requested:
        return [Target(f":{i}", device, i) for i, device in enumerate(devices)], []
    targets, taken, missing = [], {}, []
    for spec in requested:
        index = resolve(spec, devices)
        if index is None:
            missing.append(spec)
            continue
        if index in taken:
            raise ValueError(f"devices {taken[index]!r} and {spec!r} name the same Edge TPU "
                             f"({devices[index].type} {devices[index].path}): one interpreter per TPU")
        taken[index] = spec
        targets.append(Target(spec, devices[index], index))
    return targets, missing


def index_of_path(path: str, devices: list[Device]) -> int | None:
    """Where a TPU is in a fresh listing: a USB Accelerator that reset may enumerate elsewhere."""
    for i, device in enumerate(devices):
        if device.path == path:
            return i
    return None


def delegate_options(spec: str | None, performance: str | None) -> dict[str, str]:
    """The options for load_delegate(): `device` only when given (as pycoral does)."""
    options = {}
    if spec:
        options["device"] = spec
    if performance:
        if performance not in PERFORMANCE:
            raise ValueError(f"Performance {performance!r} is not one of {', '.join(PERFORMANCE)}")
        options["Performance"] = performance
    return options
