"""Shared fixtures: real photos, the committed models, and a real service on a real socket."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.service import ServiceProcess as Service  # the one launcher, shared with bench/
from converter.photos import photo

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
DEFAULT_MODEL = "efficientnet_lite0"


@pytest.fixture(scope="session")
def cat_png() -> Path:
    return photo("scikit-image", "skimage/data/chelsea.png")


@pytest.fixture(scope="session")
def coffee_png() -> Path:
    return photo("scikit-image", "skimage/data/coffee.png")


@pytest.fixture(scope="session")
def china_jpg() -> Path:
    return photo("scikit-learn", "sklearn/datasets/images/china.jpg")


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
