"""Device-access diagnosis on real files: nodes that exist or not, readable or not."""

import os
import tempfile
from pathlib import Path

import pytest

from app.edgetpu.access import (RUN_USB, DeviceTree, access_problem, custom_op_message, delegate_failure_message,
                                no_device_message, usb_node)
from app.edgetpu.library import Device
from tests.doubles.usb_tree import fake_usb_tree

NOBODY = 65534


def test_a_missing_pcie_node_names_the_device_flag(tmp_path):
    problem = access_problem(Device("pci", str(tmp_path / "apex_0")))
    assert "does not exist here" in problem and "--device /dev/apex_0" in problem and "gasket" in problem


def _as_nobody(check) -> str:
    """Run check() in a forked child that dropped root (root passes every access check)."""
    if os.geteuid() != 0:
        return check()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the loaded modules, another user
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, str(check()).encode())
        except BaseException as e:  # reported to the parent's assertion
            os.write(write, f"child failed: {e!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return out


@pytest.mark.parametrize("directory_mode", [0o755, 0o700], ids=["node closed", "directory closed"])
def test_a_node_this_user_cannot_open_names_the_group_fix(directory_mode):
    with tempfile.TemporaryDirectory() as directory:
        node = Path(directory) / "apex_0"
        node.write_bytes(b"")
        node.chmod(0o600)  # owner only, like /dev/apex_0 without the apex group
        Path(directory).chmod(directory_mode)
        out = _as_nobody(lambda: access_problem(Device("pci", str(node))))
    assert "is not readable and writable by uid" in out and "--group-add $(stat -c %g /dev/apex_0)" in out


def test_usb_checks_the_bus_is_mapped(tmp_path):
    tree = DeviceTree(usb=tmp_path / "dev-bus-usb", usb_sysfs=tmp_path / "sys")  # a /dev/bus/usb that is not there
    problem = access_problem(Device("usb", "/sys/bus/usb/devices/2-1"), tree)
    assert "does not exist here" in problem and RUN_USB in problem and "re-enumerates" in problem
    assert "`--device /dev/bus/usb` is not enough" in problem


def test_usb_node_from_sysfs_busnum_and_devnum(tmp_path):
    sysfs = tmp_path / "sys" / "2-1"
    sysfs.mkdir(parents=True)
    (sysfs / "busnum").write_text("2\n")
    (sysfs / "devnum").write_text("5\n")
    bus = tmp_path / "dev-bus-usb"
    tree = DeviceTree(usb=bus, usb_sysfs=tmp_path / "sys", mountinfo=tmp_path / "no-mountinfo")
    device = Device("usb", str(sysfs))
    assert usb_node(device, bus) == bus / "002" / "005"
    bus.mkdir()
    assert "002/005 does not exist here" in access_problem(device, tree)  # bus mapped, this node not (stale)
    (bus / "002").mkdir()
    (bus / "002" / "005").write_bytes(b"")
    assert access_problem(device, tree) is None or os.geteuid() != 0


def test_no_device_message_covers_both_kinds(tmp_path):
    message = no_device_message("libedgetpu.so.1", fake_usb_tree(tmp_path, [], live=True))
    assert message.startswith("no Edge TPU found: libedgetpu.so.1 lists no device")
    assert "lsusb -d 1a6e:089a" in message and RUN_USB in message and "--device /dev/apex_0" in message


def test_a_delegate_failure_with_nothing_visible_blocking_it(tmp_path):
    node = tmp_path / "apex_0"
    node.write_bytes(b"")
    message = delegate_failure_message("libedgetpu.so.1", Device("pci", str(node)), ":0",
                                       "Failed to load delegate from libedgetpu.so.1\n")
    assert "cannot open the Edge TPU :0" in message and "another process" in message


def test_custom_op_message_names_the_plain_model(tmp_path):
    message = custom_op_message(tmp_path / "m_int8_edgetpu.tflite", "cpu")
    assert "compiled for the Edge TPU" in message and "the cpu backend cannot run it" in message
    assert "(m_int8.tflite) as the 'int8' file" in message
