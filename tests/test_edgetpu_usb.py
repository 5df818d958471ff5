"""The USB Accelerator's change of identity (1a6e:089a until its firmware is loaded, then 18d1:9302 on a new node),
diagnosed from FAKE device trees (tests/doubles/usb_tree.py): sysfs, /dev/bus/usb and the mounts, as a container
with `--device /dev/bus/usb` (a copy of the nodes) or with a bind mount of the bus (live) sees them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.edgetpu import usb
from app.edgetpu.access import RUN_USB, access_problem, no_device_message, usb_bus_warning, usb_enumeration_problem
from app.edgetpu.errors import EdgeTpuUnavailable
from app.edgetpu.library import Device
from app.engines.edgetpu import check_tpus
from tests.conftest import ROOT
from tests.doubles.libedgetpu import DEVICES, libedgetpu_double  # noqa: F401
from tests.doubles.usb_tree import FakeUsb, descriptor, fake_usb_tree

BOOTLOADER, RUNTIME = "1a6e:089a", "18d1:9302"
MOUSE = "046d:c077"
BOOTLOADER_MESSAGE = "a TPU in bootloader mode was found"
NOT_VISIBLE = "but its re-enumerated node is not visible in this container"


def test_descriptors_name_vendor_and_product():
    assert usb.descriptor_id(descriptor(BOOTLOADER)) == BOOTLOADER
    assert usb.descriptor_id(descriptor(RUNTIME)) == RUNTIME
    assert usb.descriptor_id(b"\x12\x02" + bytes(16)) is None  # a configuration descriptor, not a device's
    assert usb.descriptor_id(b"") is None


def test_only_the_bootloader_identity_visible_in_a_copied_bus(tmp_path):
    """The first day with `docker run --device /dev/bus/usb`: the TPU was 1a6e:089a when the container was made."""
    tree = fake_usb_tree(tmp_path, [FakeUsb(BOOTLOADER, 2, 4), FakeUsb(MOUSE, 1, 2)], live=False)
    message = usb_enumeration_problem(tree)
    assert message.startswith(f"{BOOTLOADER_MESSAGE} ({BOOTLOADER} on bus 2 address 4 (seen in sysfs); "
                              f"{BOOTLOADER} on bus 2 address 4 (seen in {tree.usb})) {NOT_VISIBLE}")
    assert "is a copy made when the container was created (`--device /dev/bus/usb` or `--privileged`)" in message
    assert f"Fix: in a container, bind-mount the whole USB bus and let the container open USB devices: " \
           f"`docker run {RUN_USB} ...`" in message
    assert "device_cgroup_rules: ['c 189:* rmw']" in message and "restart the container" in message
    assert no_device_message("libedgetpu.so.1", tree) == f"no Edge TPU found: libedgetpu.so.1 lists no device: {message}"


def test_the_nodes_alone_tell_it_where_sysfs_is_not_mapped(tmp_path):
    tree = fake_usb_tree(tmp_path, [FakeUsb(BOOTLOADER, 3, 7, in_sysfs=False)], live=False)
    message = usb_enumeration_problem(tree)
    assert message.startswith(f"{BOOTLOADER_MESSAGE} ({BOOTLOADER} on bus 3 address 7 (seen in {tree.usb})) {NOT_VISIBLE}")


def test_after_the_firmware_load_the_new_node_is_missing(tmp_path):
    """libedgetpu loaded the firmware: sysfs (the host's view) has 18d1:9302 at a new address, the copy does not."""
    tree = fake_usb_tree(tmp_path, [FakeUsb(RUNTIME, 2, 5, node=False)], live=False)
    message = usb_enumeration_problem(tree)
    assert message.startswith(f"the USB Accelerator re-enumerated as {RUNTIME} after its firmware was loaded "
                              f"({RUNTIME} on bus 2 address 5 (seen in sysfs)), but its node {tree.usb}/002/005 "
                              "does not exist here")
    assert RUN_USB in message
    # libedgetpu lists it by its sysfs directory: the start-up check names the same cause
    problem = access_problem(Device("usb", str(tree.usb_sysfs / "2-1")), tree)
    assert problem == message


def test_a_usable_tpu_is_no_problem(tmp_path):
    tree = fake_usb_tree(tmp_path, [FakeUsb(RUNTIME, 2, 5)], live=True)
    assert usb_enumeration_problem(tree) is None
    assert access_problem(Device("usb", str(tree.usb_sysfs / "2-1")), tree) is None
    assert usb_enumeration_problem(fake_usb_tree(tmp_path / "none", [FakeUsb(MOUSE, 1, 2)], live=False)) is None


def test_a_live_bus_that_still_shows_only_the_bootloader(tmp_path):
    """The bus is bind-mounted, yet no 18d1:9302 came: the firmware did not load (cgroup, power)."""
    tree = fake_usb_tree(tmp_path, [FakeUsb(BOOTLOADER, 2, 4)], live=True)
    message = usb_enumeration_problem(tree)
    assert f"{BOOTLOADER_MESSAGE} " in message and "its firmware did not load" in message
    assert "--device-cgroup-rule='c 189:* rmw'" in message and "replug" in message


def test_whether_the_bus_is_live_comes_from_the_mounts(tmp_path):
    assert usb.bus_is_live(Path("/dev/bus/usb"), Path("/proc/self/mountinfo")) is (
        "devtmpfs" in next(line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                           if line.split()[4] == "/dev"))
    copied = fake_usb_tree(tmp_path / "copy", [], live=False)
    bound = fake_usb_tree(tmp_path / "bound", [], live=True)
    assert usb.bus_is_live(copied.usb, copied.mountinfo) is False
    assert usb.bus_is_live(bound.usb, bound.mountinfo) is True
    assert usb.bus_is_live(bound.usb, tmp_path / "unreadable") is None
    assert "is a copy made when this container was created" in usb_bus_warning(copied)
    assert usb_bus_warning(bound) is None


def test_open_problems_are_told_apart(tmp_path):
    assert usb.open_problem(tmp_path / "missing") == "does not exist here"
    node = tmp_path / "node"
    node.write_bytes(b"")
    assert usb.open_problem(node) is None


def test_the_start_up_check_names_the_bootloader_trap(tmp_path, libedgetpu_double, monkeypatch):
    """With the libedgetpu TEST DOUBLE listing no TPU, or listing the one whose node is gone."""
    tree = fake_usb_tree(tmp_path, [FakeUsb(BOOTLOADER, 2, 4)], live=False)
    monkeypatch.setenv(DEVICES, "")
    with pytest.raises(EdgeTpuUnavailable, match=f"no Edge TPU found: .* lists no device: {BOOTLOADER_MESSAGE}"):
        check_tpus(str(libedgetpu_double), [], "strict", tree)
    moved = fake_usb_tree(tmp_path / "moved", [FakeUsb(RUNTIME, 2, 5, node=False)], live=False)
    monkeypatch.setenv(DEVICES, f"usb:{moved.usb_sysfs / '2-1'}")
    with pytest.raises(EdgeTpuUnavailable, match=f"cannot open the Edge TPU :0: the USB Accelerator re-enumerated "
                                                 f"as {RUNTIME}"):
        check_tpus(str(libedgetpu_double), [], "strict", moved)


def test_the_service_says_it_at_start(tmp_path, libedgetpu_double):
    """`python -m app` pointed at the fake tree by its settings: one line, the cause and the fix."""
    tree = fake_usb_tree(tmp_path, [FakeUsb(BOOTLOADER, 2, 4)], live=False)
    env = {"EDGETPU_SERVE_BACKENDS": "edgetpu", "EDGETPU_SERVE_PORT": "0", "PATH": "/usr/bin:/bin",
           "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), DEVICES: "",
           "EDGETPU_SERVE_EDGETPU_USB_DIR": str(tree.usb), "EDGETPU_SERVE_EDGETPU_USB_SYSFS_DIR": str(tree.usb_sysfs)}
    done = subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("edgetpu-serve: cannot start: ")]
    assert f"{BOOTLOADER_MESSAGE} ({BOOTLOADER} on bus 2 address 4" in line and NOT_VISIBLE in line
    assert RUN_USB in line
