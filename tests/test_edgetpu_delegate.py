import pytest

from app.edgetpu.delegate import delegate_options, index_of_path, is_device_spec, resolve, resolve_targets
from app.edgetpu.library import Device

USB_A = Device("usb", "/sys/bus/usb/devices/2-1")
PCI = Device("pci", "/dev/apex_0")
USB_B = Device("usb", "/sys/bus/usb/devices/4-2")
LISTED = [USB_A, PCI, USB_B]


@pytest.mark.parametrize("spec, index", [
    ("", 0), (":0", 0), (":1", 1), (":2", 2), (":3", None),
    ("usb", 0), ("usb:0", 0), ("usb:1", 2), ("usb:2", None),
    ("pci", 1), ("pci:0", 1), ("pci:1", None),
])
def test_resolve_follows_libedgetpus_rules(spec, index):
    assert resolve(spec, LISTED) == index


@pytest.mark.parametrize("spec", ["usb0", "usb:", ":", "pcie:0", ":-1", "usb:x", " usb"])
def test_malformed_specs(spec):
    assert not is_device_spec(spec)
    with pytest.raises(ValueError, match="is not one of"):
        resolve(spec, LISTED)


def test_every_listed_tpu_gets_an_interpreter_when_none_is_named():
    targets = resolve_targets([], LISTED)
    assert [(t.spec, t.device) for t in targets] == [(":0", USB_A), (":1", PCI), (":2", USB_B)]


def test_named_specs_open_by_index():
    targets = resolve_targets(["usb:1", "pci"], LISTED)
    assert [(t.requested, t.spec, t.device) for t in targets] == [("usb:1", ":2", USB_B), ("pci", ":1", PCI)]


def test_a_spec_that_names_no_tpu_says_what_is_listed():
    with pytest.raises(ValueError, match=r"device 'pci:1' names no Edge TPU; libedgetpu lists: :0 usb .*:1 pci /dev/apex_0"):
        resolve_targets(["pci:1"], LISTED)
    with pytest.raises(ValueError, match="lists: none"):
        resolve_targets([":0"], [])


def test_two_specs_for_one_tpu_are_refused():
    with pytest.raises(ValueError, match="'usb:0' and ':0' name the same Edge TPU"):
        resolve_targets(["usb:0", ":0"], LISTED)


def test_a_reset_device_is_found_again_by_path():
    assert index_of_path(USB_B.path, [USB_B, USB_A]) == 0
    assert index_of_path(USB_B.path, [USB_A]) is None


def test_delegate_options():
    assert delegate_options(None, None) == {}
    assert delegate_options(":1", None) == {"device": ":1"}
    assert delegate_options(":0", "High") == {"device": ":0", "Performance": "High"}
    with pytest.raises(ValueError, match="Low, Medium, High, Max"):
        delegate_options(":0", "Turbo")
