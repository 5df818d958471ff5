"""Builds the libedgetpu TEST DOUBLE (libedgetpu_test_double.c) and sets what it pretends.

The double is a real shared library with libedgetpu's C API and delegate entry points;
it lists the devices the tests choose, and its delegate claims the uint8/int8 QUANTIZE
operators and computes them itself (counted, and logged per device). See the C file.
"""

from __future__ import annotations

import gc
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("libedgetpu_test_double.c")
DEVICES = "EDGETPU_TEST_DOUBLE_DEVICES"
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
