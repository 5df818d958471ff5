"""Shared fixtures: real photos, the committed models, and a real service on a real socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from converter.photos import photo

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
DEFAULT_MODEL = "efficientnet_lite0"
READY_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def cat_png() -> Path:
    return photo("scikit-image", "skimage/data/chelsea.png")


@pytest.fixture(scope="session")
def coffee_png() -> Path:
    return photo("scikit-image", "skimage/data/coffee.png")


@pytest.fixture(scope="session")
def china_jpg() -> Path:
    return photo("scikit-learn", "sklearn/datasets/images/china.jpg")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """`python -m app` in a subprocess, on a free port, with settings from env."""

    def __init__(self, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "EDGETPU_SERVE_PORT": str(self.port), "EDGETPU_SERVE_HOST": "127.0.0.1", **env}
        self.process = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=full_env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited {self.process.returncode}: {self.process.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"service not ready within {READY_TIMEOUT_S} s")

    def stop(self) -> str:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return out


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
