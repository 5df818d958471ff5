"""Why an Edge TPU cannot be used, and the exact fix: one message per failure.

libedgetpu itself says little ("Failed to load delegate from libedgetpu.so.1" for a
missing device node, a permission problem or a busy device alike), so the service looks
at the device nodes the way the library will open them and names what is missing. For the
USB Accelerator it also reads the bus (app/edgetpu/usb.py): a TPU in bootloader mode whose
re-enumerated node this container cannot see is the first-day trap of `--device /dev/bus/usb`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.edgetpu import usb
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.edgetpu.library import Device
from app.edgetpu.usb import BOOTLOADER_ID, RUNTIME_ID, USB_IDS, USB_MAJOR

APEX_GLOB = "apex_*"


@dataclass(frozen=True)
class DeviceTree:
    """Where this process looks at devices. The service's are the real ones; tests point it at fake trees
    (EDGETPU_SERVE_EDGETPU_USB_DIR, EDGETPU_SERVE_EDGETPU_USB_SYSFS_DIR)."""

    usb: Path = Path("/dev/bus/usb")
    usb_sysfs: Path = Path("/sys/bus/usb/devices")
    dev: Path = Path("/dev")
    mountinfo: Path = Path("/proc/self/mountinfo")


HOST = DeviceTree()

RUN_USB = "-v /dev/bus/usb:/dev/bus/usb --device-cgroup-rule='c 189:* rmw'"
FIX_USB_NOT_MAPPED = (
    f"in a container, bind-mount the whole USB bus and let the container open USB devices: `docker run {RUN_USB} "
    "...` (compose: volumes: [/dev/bus/usb:/dev/bus/usb], device_cgroup_rules: ['c 189:* rmw']). "
    "`--device /dev/bus/usb` is not enough: it copies the nodes that exist when the container is created, and the "
    f"Accelerator re-enumerates from {BOOTLOADER_ID} to {RUNTIME_ID} on first use, on a new node"
)
FIX_USB_PERMISSION = (
    "on the host, install the udev rules (docs/deployment.md 'USB Accelerator': "
    "/etc/udev/rules.d/99-edgetpu-accelerator.rules giving GROUP=\"plugdev\" to "
    f"{' and '.join(USB_IDS)}), run `sudo udevadm control --reload-rules && sudo udevadm trigger`, "
    "replug the Accelerator, and run as a member of plugdev (`sudo usermod -aG plugdev $USER`, then log in "
    "again; in a container `--group-add $(getent group plugdev | cut -d: -f3)`)"
)
FIX_USB_ABSENT = (
    f"plug the USB Accelerator in (host: `lsusb -d {BOOTLOADER_ID}` or `lsusb -d {RUNTIME_ID}` lists it), "
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


def usb_node(device: Device, usb_root: Path = HOST.usb) -> Path | None:
    """/dev/bus/usb/BBB/DDD of a USB TPU, from its sysfs directory's busnum and devnum."""
    try:
        bus = int((Path(device.path) / "busnum").read_text())
        dev = int((Path(device.path) / "devnum").read_text())
    except (OSError, ValueError):
        return None
    return usb_root / f"{bus:03d}" / f"{dev:03d}"


def usb_enumeration_problem(tree: DeviceTree = HOST) -> str | None:
    """A USB Accelerator that sysfs or /dev/bus/usb shows but this process cannot use because of where its
    firmware load put it; None when a TPU in runtime mode opens here, or none is seen at all."""
    seen = usb.tpus_in_sysfs(tree.usb_sysfs) + usb.tpus_on_nodes(tree.usb)
    runtime = [t for t in seen if not t.bootloader]
    problems = {t: usb.open_problem(t.node(tree.usb)) for t in runtime}
    if runtime and not all(problems.values()):
        return None
    live = usb.bus_is_live(tree.usb, tree.mountinfo)
    bus = ("is a copy made when the container was created (`--device /dev/bus/usb` or `--privileged`): new "
           "nodes never appear in it" if live is False else
           "shows new nodes as they come" if live else "may be a copy made when the container was created")
    restart = ("; or, until the Accelerator is unplugged or the host restarts, restart the container now that "
               "the TPU has its firmware")
    if runtime:
        tpu = runtime[0]
        return (f"the USB Accelerator re-enumerated as {RUNTIME_ID} after its firmware was loaded ({tpu.describe()}), "
                f"but its node {tpu.node(tree.usb)} {problems[tpu]}; this container's {tree.usb} {bus}. "
                f"Fix: {FIX_USB_NOT_MAPPED}{restart}")
    booting = [t for t in seen if t.bootloader]
    if not booting:
        return None
    where = "; ".join(t.describe() for t in booting)
    if live:
        return (f"a TPU in bootloader mode was found ({where}) but its re-enumerated node ({RUNTIME_ID}) is not "
                f"visible in this container, though {tree.usb} {bus}: its firmware did not load. Fix: let the "
                f"container open USB devices (--device-cgroup-rule='c {USB_MAJOR}:* rmw'), and unplug and replug "
                "the Accelerator (a USB 3 port, or a powered hub)")
    return (f"a TPU in bootloader mode was found ({where}) but its re-enumerated node is not visible in this "
            f"container: {tree.usb} {bus}. Fix: {FIX_USB_NOT_MAPPED}{restart}")


def usb_bus_warning(tree: DeviceTree = HOST) -> str | None:
    """At start, with a USB TPU in use: a bus copied at the container's creation loses the TPU at its next
    reset or replug, which comes back on a new node. None when the bus is live or unknown."""
    if usb.bus_is_live(tree.usb, tree.mountinfo) is not False:
        return None
    return (f"{tree.usb} is a copy made when this container was created (`--device /dev/bus/usb`): a USB "
            "Accelerator that resets or is replugged comes back on a new node that this container will not see "
            f"until it restarts. Fix: {FIX_USB_NOT_MAPPED}")


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


def access_problem(device: Device, tree: DeviceTree = HOST) -> str | None:
    """What stops this process from opening the TPU, or None when nothing visible does."""
    if device.type == "pci":
        return _node_problem(Path(device.path), FIX_PCI_NOT_MAPPED, FIX_PCI_PERMISSION)
    if device.type == "usb":
        if not tree.usb.is_dir():
            return f"{tree.usb} does not exist here. Fix: {FIX_USB_NOT_MAPPED}"
        node = usb_node(device, tree.usb)
        problem = _node_problem(node, FIX_USB_NOT_MAPPED, FIX_USB_PERMISSION) if node is not None else None
        enumeration = usb_enumeration_problem(tree) if problem or node is None else None
        return enumeration or problem
    return None


def no_device_message(library_path: str, tree: DeviceTree = HOST) -> str:
    """No TPU listed: say which of the two kinds could be missing, and how to bring each in; a USB
    Accelerator the bus shows but this container cannot reach, first."""
    enumeration = usb_enumeration_problem(tree)
    if enumeration:
        return f"no Edge TPU found: {library_path} lists no device: {enumeration}"
    apex = sorted(str(p) for p in tree.dev.glob(APEX_GLOB))
    bus = "present" if tree.usb.is_dir() else "absent (not mapped into this container?)"
    return (
        f"no Edge TPU found: {library_path} lists no device ({tree.usb} {bus}; PCIe nodes: "
        f"{', '.join(apex) or 'none'}). Fix, USB Accelerator: {FIX_USB_ABSENT}. Fix, Dev Board or PCIe/M.2: "
        f"{FIX_PCI_NOT_MAPPED}"
    )


def delegate_failure_message(library_path: str, device: Device, spec: str, error: str,
                             tree: DeviceTree = HOST) -> str:
    """load_delegate() refused: name the access problem when one is visible."""
    problem = access_problem(device, tree)
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
