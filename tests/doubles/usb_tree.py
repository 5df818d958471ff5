"""A FAKE USB bus as a process sees it, written by the tests: sysfs' devices (idVendor, idProduct, busnum, devnum),
the /dev/bus/usb nodes (regular files that read as the device's descriptor, as usbfs nodes do), and a mountinfo
that says whether that /dev/bus/usb is live (a bind mount of the host's devtmpfs) or a copy (a container's tmpfs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.edgetpu.access import DeviceTree


@dataclass(frozen=True)
class FakeUsb:
    usb_id: str              # vendor:product
    bus: int
    address: int
    port: str = "1"          # sysfs names the device by where it is plugged: BUS-PORT
    in_sysfs: bool = True
    node: bool = True        # its /dev/bus/usb node exists here


def descriptor(usb_id: str) -> bytes:
    """An 18-byte USB device descriptor with this vendor:product (USB 3.1, class from the interface)."""
    vendor, product = (int(part, 16) for part in usb_id.split(":"))
    return (bytes([18, 1, 0x10, 0x03, 0, 0, 0, 9]) + vendor.to_bytes(2, "little") + product.to_bytes(2, "little")
            + bytes([0x00, 0x01, 1, 2, 0, 1]))


def fake_usb_tree(root: Path, devices: list[FakeUsb], live: bool) -> DeviceTree:
    tree = DeviceTree(usb=root / "dev" / "bus" / "usb", usb_sysfs=root / "sys" / "bus" / "usb" / "devices",
                      dev=root / "dev", mountinfo=root / "mountinfo")
    tree.usb.mkdir(parents=True)
    tree.usb_sysfs.mkdir(parents=True)
    for device in devices:
        vendor, product = device.usb_id.split(":")
        if device.in_sysfs:
            entry = tree.usb_sysfs / f"{device.bus}-{device.port}"
            entry.mkdir()
            for name, text in (("idVendor", vendor), ("idProduct", product), ("busnum", str(device.bus)),
                               ("devnum", str(device.address))):
                (entry / name).write_text(text + "\n")
        if device.node:
            node = tree.usb / f"{device.bus:03d}" / f"{device.address:03d}"
            node.parent.mkdir(exist_ok=True)
            node.write_bytes(descriptor(device.usb_id))
    # as in a container: / an overlay, /dev a tmpfs, and with -v /dev/bus/usb:/dev/bus/usb the host's devtmpfs on it
    mounts = ["1 0 0:30 / / rw,relatime - overlay overlay rw",
              f"2 1 0:31 / {tree.dev} rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755"]
    if live:
        mounts.append(f"3 2 0:6 /bus/usb {tree.usb} rw,relatime - devtmpfs udev rw,size=8059236k,mode=755")
    tree.mountinfo.write_text("\n".join(mounts) + "\n")
    return tree
