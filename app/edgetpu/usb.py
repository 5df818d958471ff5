"""The USB Accelerator as this process can see it, and its change of identity on first use.

The Accelerator enumerates as 1a6e:089a (Global Unichip, its bootloader) until libedgetpu loads its
firmware, then comes back as 18d1:9302 (Google) at a new address, so under a new /dev/bus/usb/BBB/DDD
node. Two views tell where it is: sysfs (/sys/bus/usb/devices/*: idVendor, idProduct, busnum, devnum;
the host's live view, in a container too) and the nodes of /dev/bus/usb themselves (each node reads as
the device's descriptor). A container that got the bus with `docker run --device /dev/bus/usb` has a copy
of the nodes made when it was created, on its own /dev (a tmpfs): the re-enumerated node never appears
there, and the device cgroup refuses what it was not given. A bind mount of the host's /dev/bus/usb (a
devtmpfs) shows new nodes as they come; a device cgroup rule for USB's major, 189, lets them open.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

BOOTLOADER_ID = "1a6e:089a"
RUNTIME_ID = "18d1:9302"
USB_IDS = (BOOTLOADER_ID, RUNTIME_ID)
USB_MAJOR = 189  # Linux's character major of USB device nodes (usb_device)
DESCRIPTOR_LENGTH = 18  # a USB device descriptor; idVendor and idProduct at bytes 8-11, little-endian
DEVICE_DESCRIPTOR = 1


@dataclass(frozen=True)
class UsbTpu:
    """An Edge TPU on the USB bus: which identity, where, and in which view it was seen."""

    usb_id: str
    bus: int
    address: int
    seen_in: str  # "sysfs" or "/dev/bus/usb"

    @property
    def bootloader(self) -> bool:
        return self.usb_id == BOOTLOADER_ID

    def node(self, usb_root: Path) -> Path:
        return usb_root / f"{self.bus:03d}" / f"{self.address:03d}"

    def describe(self) -> str:
        return f"{self.usb_id} on bus {self.bus} address {self.address} (seen in {self.seen_in})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def tpus_in_sysfs(sysfs_root: Path) -> list[UsbTpu]:
    """The TPUs sysfs lists (/sys/bus/usb/devices/*), either identity."""
    try:
        entries = sorted(sysfs_root.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        vendor, product = _read(entry / "idVendor"), _read(entry / "idProduct")
        if f"{vendor}:{product}".lower() not in USB_IDS:
            continue
        try:
            bus, address = int(_read(entry / "busnum") or ""), int(_read(entry / "devnum") or "")
        except ValueError:
            continue
        found.append(UsbTpu(f"{vendor}:{product}".lower(), bus, address, "sysfs"))
    return found


def descriptor_id(data: bytes) -> str | None:
    """vendor:product of a USB device descriptor, as a usbfs node reads; None if it is not one."""
    if len(data) < DESCRIPTOR_LENGTH or data[1] != DEVICE_DESCRIPTOR:
        return None
    vendor, product = int.from_bytes(data[8:10], "little"), int.from_bytes(data[10:12], "little")
    return f"{vendor:04x}:{product:04x}"


def tpus_on_nodes(usb_root: Path) -> list[UsbTpu]:
    """The TPUs among the nodes of /dev/bus/usb this process can read (reading one opens nothing for use)."""
    found = []
    for node in sorted(usb_root.glob("[0-9][0-9][0-9]/[0-9][0-9][0-9]")):
        try:
            with open(node, "rb", buffering=0) as f:
                usb_id = descriptor_id(f.read(DESCRIPTOR_LENGTH))
        except OSError:
            continue  # not readable here, or gone: sysfs may still say what it is
        if usb_id in USB_IDS:
            found.append(UsbTpu(usb_id, int(node.parent.name), int(node.name), str(usb_root)))
    return found


def open_problem(node: Path) -> str | None:
    """Why this process cannot open a USB node for use (as libusb does: read and write); None if it can."""
    try:
        fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return "does not exist here"
    except OSError as e:
        if e.errno == errno.EPERM:
            return f"is refused by this container's device cgroup (EPERM: USB's major {USB_MAJOR} not allowed)"
        if e.errno == errno.EACCES:
            return (f"is not readable and writable by uid {os.getuid()} "
                    f"(groups {sorted(os.getgroups())})")
        if e.errno in (errno.ENODEV, errno.ENXIO):
            return "is stale: the device that had it is gone"
        return f"cannot be opened ({os.strerror(e.errno or 0)})"
    os.close(fd)
    return None


def bus_is_live(usb_root: Path, mountinfo: Path) -> bool | None:
    """Whether new nodes appear under usb_root as the kernel makes them: True on a devtmpfs (the host's
    /dev, or a bind mount of its /dev/bus/usb), False on a copy (a container's tmpfs /dev, what
    `--device /dev/bus/usb` and `--privileged` give), None when the mounts cannot be read."""
    text = _read(mountinfo)
    if text is None:
        return None
    target, best = str(usb_root), None
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split()[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    if best is None:
        return None
    return best[1] == "devtmpfs"
