"""Builds the libedgetpu TEST DOUBLE (libedgetpu_test_double.c) and sets what it pretends.

The double is a real shared library with libedgetpu's C API and delegate entry points;
it lists the devices the tests choose, and its delegate claims the uint8/int8 QUANTIZE
operators and computes them itself (counted, and logged per device). See the C file.

`PluggedTpus` is the double's list of TPUs as a file it reads again at every call: a test plugs
TPUs in and unplugs them while a service runs, in its process or in another one; a delegate
whose TPU was unplugged fails its invokes.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("libedgetpu_test_double.c")
DEVICES = "EDGETPU_TEST_DOUBLE_DEVICES"
DEVICES_FILE = "EDGETPU_TEST_DOUBLE_DEVICES_FILE"
VERSION = "EDGETPU_TEST_DOUBLE_VERSION"
OPEN = "EDGETPU_TEST_DOUBLE_OPEN"
LOG = "EDGETPU_TEST_DOUBLE_LOG"
INVOKE_LOG = "EDGETPU_TEST_DOUBLE_INVOKE_LOG"
EXCLUSIVE = "EDGETPU_TEST_DOUBLE_EXCLUSIVE"  # "1": one process per device, as a claimed USB interface
RUNTIME_14 = "BuildLabel(COMPILER=test double,DATE=redacted,TIME=redacted), RuntimeVersion(14)"


def log_delegates(monkeypatch, path: Path) -> Path:
    """From now on the double logs each delegate created and destroyed to `path`. Delegates left by
    earlier tests are collected first: their "destroyed" lines would otherwise land in this log."""
    gc.collect()
    monkeypatch.setenv(LOG, str(path))
    return path


def build(directory: Path) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("the libedgetpu test double needs a C compiler: apt-get install gcc")
    library = directory / "libedgetpu_test_double.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(library),
                    str(SOURCE)], check=True, capture_output=True, text=True)
    return library


@pytest.fixture(scope="session")
def libedgetpu_double(tmp_path_factory) -> Path:
    """Path of the compiled test double (one build per test session)."""
    return build(tmp_path_factory.mktemp("libedgetpu_double"))


def devices(*entries: str) -> str:
    """EDGETPU_TEST_DOUBLE_DEVICES from TYPE:PATH entries."""
    return ",".join(entries)


class PluggedTpus:
    """The TPUs the double lists, as a file it reads at every call (DEVICES_FILE): plug() and unplug()
    change what every process using the double sees from its next call on. Each entry is TYPE:PATH;
    a PCIe TPU's PATH is a file standing for its device node, made here (where its directory exists) so
    that the service can open it."""

    def __init__(self, directory: Path, *entries: str):
        self.file = directory / "plugged_tpus"
        self.entries: list[str] = []
        self._write()
        self.plug(*entries)

    def plug(self, *entries: str) -> None:
        for entry in entries:
            kind, _, path = entry.partition(":")
            if kind == "pci" and Path(path).parent.is_dir():
                Path(path).touch()
            if entry not in self.entries:
                self.entries.append(entry)
        self._write()

    def unplug(self, *entries: str) -> None:
        self.entries = [entry for entry in self.entries if entry not in entries]
        self._write()

    def _write(self) -> None:
        """Whole or not at all: a reader never sees half a list."""
        partial = self.file.with_suffix(".partial")
        partial.write_text("\n".join(self.entries) + "\n")
        os.replace(partial, self.file)

    def env(self) -> dict[str, str]:
        return {DEVICES_FILE: str(self.file)}


@pytest.fixture
def plugged_tpus(tmp_path, monkeypatch) -> PluggedTpus:
    """No TPU plugged in yet. The double in this process reads its list from the file; give a service
    started by the test `plugged_tpus.env()`."""
    plugged = PluggedTpus(tmp_path)
    monkeypatch.setenv(DEVICES_FILE, str(plugged.file))
    return plugged


def pci_tpu(directory: Path, i: int) -> str:
    """The i-th PCIe TPU's entry, its node a file in `directory`."""
    return f"pci:{directory / f'apex_{i}'}"
