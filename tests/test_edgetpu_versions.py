import pytest

from app.edgetpu.versions import (
    VERSIONS_FILE,
    LibraryVersion,
    check_model_runtime,
    check_pairing,
    image_pins,
    installed_package_version,
    matching_set,
    package_too_new,
    pins,
    read_pins,
)
from app.edgetpu.errors import EdgeTpuVersionMismatch

FERANICK = LibraryVersion("BuildLabel(...), RuntimeVersion(14)", 14, "16.0tf2.17.1-1.bookworm")
CORAL = LibraryVersion("BuildLabel(...), RuntimeVersion(14)", 14, "16.0")
NO_PACKAGE = LibraryVersion("BuildLabel(...), RuntimeVersion(14)", 14, None)

DPKG_STATUS = """\
Package: libusb-1.0-0
Status: install ok installed
Version: 2:1.0.26-1

Package: libedgetpu1-max
Status: deinstall ok config-files
Version: 16.0

Package: libedgetpu1-std
Status: install ok installed
Priority: optional
Version: 16.0tf2.17.1-1.bookworm
Description: Support library for Edge TPU
 Support library (standard speed) for the Edge TPU
"""


def test_the_versions_file_lists_the_sets_the_issue_pins():
    names = {s.name: s for s in pins().sets}
    assert set(names) == {"feranick-tf2.17.1-litert", "feranick-tf2.17.1", "coral-grouper", "mendel-eagle"}
    assert (names["feranick-tf2.17.1"].libedgetpu, names["feranick-tf2.17.1"].tflite_runtime) == ("16.0tf2.17.1", "2.17.1")
    assert (names["coral-grouper"].libedgetpu, names["coral-grouper"].tflite_runtime) == ("16.0", "2.5.0.post1")
    # the images: the community libedgetpu with the dev venv's runtime, ai-edge-litert (docker/requirements.txt)
    litert = names["feranick-tf2.17.1-litert"]
    assert (litert.libedgetpu, litert.runtime, litert.tflite_runtime) == ("16.0tf2.17.1", "ai-edge-litert", "2.3.0")
    image = image_pins()
    assert image.set == litert.name and image.tflite_runtime_version == litert.tflite_runtime
    assert image.libedgetpu_deb_version.startswith(litert.libedgetpu)


def test_images_must_install_a_listed_set(tmp_path):
    broken = tmp_path / "versions.toml"
    broken.write_text(VERSIONS_FILE.read_text().replace('set = "feranick-tf2.17.1-litert"', 'set = "nowhere"'))
    with pytest.raises(KeyError, match="nowhere"):
        read_pins(broken)


@pytest.mark.parametrize("library, runtime, version, expected", [
    (FERANICK, "tflite-runtime", "2.17.1", "feranick-tf2.17.1"),
    (NO_PACKAGE, "tflite-runtime", "2.17.1", "feranick-tf2.17.1"),
    (CORAL, "tflite-runtime", "2.5.0.post1", "coral-grouper"),
    (CORAL, "tflite-runtime", "2.17.1", None),           # Coral's 16.0 with a newer runtime
    (FERANICK, "tflite-runtime", "2.5.0.post1", None),
    (FERANICK, "ai-edge-litert", "2.3.0", "feranick-tf2.17.1-litert"),  # the images' pair
    (CORAL, "ai-edge-litert", "2.3.0", None),           # Coral's own 16.0 is not paired with it
    (FERANICK, "ai-edge-litert", "2.2.0", None),
    (LibraryVersion("RuntimeVersion(13)", 13, None), "tflite-runtime", "2.17.1", None),
])
def test_matching_set(library, runtime, version, expected):
    found = matching_set(library, runtime, version)
    assert (found.name if found else None) == expected


def test_a_mismatch_names_both_versions_and_the_fix():
    with pytest.raises(EdgeTpuVersionMismatch) as error:
        check_pairing(CORAL, "tflite-runtime", "2.17.1")
    message = str(error.value)
    assert "package 16.0" in message and "runtime 14" in message and "tflite-runtime 2.17.1" in message
    assert "libedgetpu1-max 16.0tf2.17.1-1 with ai-edge-litert 2.3.0" in message
    assert "EDGETPU_SERVE_EDGETPU_VERSION_CHECK=warn" in message


def test_installed_package_version_from_dpkg_status(tmp_path):
    status = tmp_path / "status"
    status.write_text(DPKG_STATUS)
    assert installed_package_version(status) == "16.0tf2.17.1-1.bookworm"
    status.write_text(DPKG_STATUS.replace("libedgetpu1-std", "something-else"))
    assert installed_package_version(status) is None  # max is only config files left
    assert installed_package_version(tmp_path / "no-dpkg-here") is None


def test_a_model_for_a_newer_runtime_is_refused_with_both_versions(tmp_path):
    path = tmp_path / "m_int8_edgetpu.tflite"
    with pytest.raises(EdgeTpuVersionMismatch) as error:
        check_model_runtime("m", path, 15, "16.0.384591198", FERANICK)
    message = str(error.value)
    assert "runtime 15 or newer" in message and "is runtime 14" in message
    assert "edgetpu_compiler 16.0.384591198" in message and "`edgetpu_compiler -m 14 m_int8.tflite`" in message
    check_model_runtime("m", path, 14, None, FERANICK)  # equal: fine
    check_model_runtime("m", path, None, None, FERANICK)  # not compiled: nothing to check


def test_libedgetpus_own_refusal_is_recognised():
    # the text libedgetpu's package_registry.cc formats when it refuses a package
    text = ("Failed precondition: Package requires runtime version (14), which is newer than this runtime "
            "version (13).Node number 1 (EdgeTpuDelegateForCustomOp) failed to prepare.")
    assert package_too_new(text) == (14, 13)
    assert package_too_new("Encountered unresolved custom op: edgetpu-custom-op.") is None
