"""Shared fixtures: real photos, the committed models, and a real service on a real socket."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from bench.service import ServiceProcess as Service  # the one launcher, shared with bench/
from converter.photos import photo
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
DEFAULT_MODEL = "efficientnet_lite0"
EXIT_GRACE_S = 15  # for a child that was told to stop and is still on its way out


def live_children(pid: int) -> list[str]:
    """'PID command' of the live (not zombie) processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:  # exited while we looked
            continue
        state, ppid = tail.split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(f"{stat.parent.name} {head.split('(', 1)[1]}")
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_run():
    """After the last test, no process a test started is left running (services, workers, scripts)."""
    yield
    with contextlib.suppress(AssertionError):  # those still running are killed, and named, below
        until(lambda: not live_children(os.getpid()), EXIT_GRACE_S, "every child gone", poll_s=0.2)
    left = live_children(os.getpid())
    for entry in left:  # not left behind by the run either
        os.kill(int(entry.split()[0]), signal.SIGKILL)
    assert not left, f"processes started by the tests still running after the last one: {left}"


@pytest.fixture(scope="session")
def cat_png() -> Path:
    return photo("scikit-image", "skimage/data/chelsea.png")


@pytest.fixture(scope="session")
def coffee_png() -> Path:
    return photo("scikit-image", "skimage/data/coffee.png")


@pytest.fixture(scope="session")
def china_jpg() -> Path:
    return photo("scikit-learn", "sklearn/datasets/images/china.jpg")


@pytest.fixture
def models_copy(tmp_path):
    """The default model's directory copied, for tests that change or reload it."""
    shutil.copytree(MODELS / DEFAULT_MODEL, tmp_path / DEFAULT_MODEL)
    return tmp_path


@pytest.fixture(scope="session")
def service():
    """The service on the committed models, default settings, a small body limit for 413 tests."""
    svc = Service({"EDGETPU_SERVE_MAX_BODY_BYTES": str(4 * 1024 * 1024),
                   "EDGETPU_SERVE_MAX_IMAGE_PIXELS": str(20_000_000)})
    svc.wait_ready()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def client(service):
    with httpx.Client(base_url=service.url, timeout=30) as c:
        yield c
