"""Why an Edge TPU cannot be used, and the exact fix: one message per failure.

libedgetpu itself says little ("Failed to load delegate from libedgetpu.so.1" for a
missing device node, a permission problem or a busy device alike), so the service looks
at the device nodes the way the library will open them and names what is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.edgetpu.library import Device

USB_ROOT = Path("/dev/bus/usb")
APEX_GLOB = "apex_*"
DEV = Path("/dev")
# The USB Accelerator's IDs: before its firmware is loaded (first use) and after.
USB_IDS = ("1a6e:089a", "18d1:9302")

FIX_USB_NOT_MAPPED = (
    "in a container, map the whole USB bus: `docker run --device /dev/bus/usb ...` (compose: "
    "devices: [/dev/bus/usb:/dev/bus/usb]); a single /dev/bus/usb/BBB/DDD node goes stale because the "
    f"Accelerator re-enumerates from {USB_IDS[0]} to {USB_IDS[1]} on first use"
)
FIX_USB_PERMISSION = (
    "on the host, install the udev rules (docs/deployment.md 'USB Accelerator': "
    "/etc/udev/rules.d/99-edgetpu-accelerator.rules giving GROUP=\"plugdev\" to "
    f"{' and '.join(USB_IDS)}), run `sudo udevadm control --reload-rules && sudo udevadm trigger`, "
    "replug the Accelerator, and run as a member of plugdev (`sudo usermod -aG plugdev $USER`, then log in "
    "again; in a container `--group-add $(getent group plugdev | cut -d: -f3)`)"
)
FIX_USB_ABSENT = (
    f"plug the USB Accelerator in (host: `lsusb -d {USB_IDS[0]}` or `lsusb -d {USB_IDS[1]}` lists it), "
    "preferably on a USB 3 port, then " + FIX_USB_NOT_MAPPED
)
FIX_PCI_NOT_MAPPED = (
    "the PCIe TPU's node /dev/apex_0 is missing: in a container pass `--device /dev/apex_0` "
    "(compose: devices: [/dev/apex_0:/dev/apex_0]); on the host the apex/gasket driver must be loaded "
    "(Dev Board: Mendel loads it; a PC with an M.2/PCIe card: install gasket-dkms, then `ls /dev/apex_0`)"
)
FIX_PCI_PERMISSION = (
    "give the service's user the apex group: on the host a udev rule "
    "`SUBSYSTEM==\"apex\", MODE=\"0660\", GROUP=\"apex\"` and `sudo usermod -aG apex $USER`; in a container "
    "`--group-add $(stat -c %g /dev/apex_0)`"
)


def usb_node(device: Device) -> Path | None:
    """/dev/bus/usb/BBB/DDD of a USB TPU, from its sysfs directory's busnum and devnum."""
    try:
        bus = int((Path(device.path) / "busnum").read_text())
        dev = int((Path(device.path) / "devnum").read_text())
    except (OSError, ValueError):
        return None
    return USB_ROOT / f"{bus:03d}" / f"{dev:03d}"


def _node_problem(node: Path, fix_missing: str, fix_permission: str) -> str | None:
    try:
        exists = node.exists()
    except PermissionError:  # a directory on the way is closed to this user
        exists = True
    if not exists:
        return f"{node} does not exist here. Fix: {fix_missing}"
    if not os.access(node, os.R_OK | os.W_OK):
        return (f"{node} is not readable and writable by uid {os.getuid()} (groups {sorted(os.getgroups())}). "
                f"Fix: {fix_permission}")
    return None


def access_problem(device: Device) -> str | None:
    """What stops this process from opening the TPU, or None when nothing visible does."""
    if device.type == "pci":
        return _node_problem(Path(device.path), FIX_PCI_NOT_MAPPED, FIX_PCI_PERMISSION)
    if device.type == "usb":
        if not USB_ROOT.is_dir():
            return f"{USB_ROOT} does not exist here. Fix: {FIX_USB_NOT_MAPPED}"
        node = usb_node(device)
        if node is not None:
            return _node_problem(node, FIX_USB_NOT_MAPPED, FIX_USB_PERMISSION)
    return None


def no_device_message(library_path: str) -> str:
    """No TPU listed: say which of the two kinds could be missing, and how to bring each in."""
    apex = sorted(str(p) for p in DEV.glob(APEX_GLOB))
    usb = "present" if USB_ROOT.is_dir() else "absent (not mapped into this container?)"
    return (
        f"no Edge TPU found: {library_path} lists no device (/dev/bus/usb {usb}; PCIe nodes: "
        f"{', '.join(apex) or 'none'}). Fix, USB Accelerator: {FIX_USB_ABSENT}. Fix, Dev Board or PCIe/M.2: "
        f"{FIX_PCI_NOT_MAPPED}"
    )


def delegate_failure_message(library_path: str, device: Device, spec: str, error: str) -> str:
    """load_delegate() refused: name the access problem when one is visible."""
    problem = access_problem(device)
    detail = error.strip().replace("\n", " ")
    what = f"cannot open the Edge TPU {spec} ({device.type} {device.path}) through {library_path} ({detail})"
    if problem:
        return f"{what}: {problem}"
    return (f"{what}. Nothing visible blocks it: another process (or a second interpreter) may hold the TPU; "
            f"stop it, or unplug and replug a USB Accelerator. Fix if in a container: "
            f"{FIX_USB_NOT_MAPPED if device.type == 'usb' else FIX_PCI_NOT_MAPPED}")


def custom_op_message(path: Path, backend: str) -> str:
    """A compiled model reached an interpreter without the Edge TPU delegate."""
    plain = path.name.replace("_edgetpu", "")
    return (
        f"{path} is compiled for the Edge TPU (it has {EDGETPU_CUSTOM_OP} nodes), so the {backend} backend "
        f"cannot run it: only the edgetpu backend (with libedgetpu's delegate) can. Fix: list the plain int8 "
        f"model ({plain}) as the 'int8' file in model.json, and the compiled one as 'edgetpu'"
    )


def is_custom_op_error(text: str) -> bool:
    return EDGETPU_CUSTOM_OP in text
