"""Which TFLite runtime the service imports: a pinned tflite_runtime (Edge TPU images) first."""

from importlib import metadata

import pytest

from app.engines import litert
from app.engines.litert import AI_EDGE_LITERT, TFLITE_RUNTIME, preference, runtime


def installed(versions: dict[str, str]):
    """Stands in for importlib.metadata.version over a package set the test chooses."""

    def version(distribution: str) -> str:
        if distribution not in versions:
            raise metadata.PackageNotFoundError(distribution)
        return versions[distribution]

    return version


@pytest.mark.parametrize("packages, first", [
    ({"tflite-runtime": "2.17.1", "ai-edge-litert": "2.3.0"}, TFLITE_RUNTIME),   # the x86-64 / arm64 images
    ({"tflite-runtime": "2.5.0.post1"}, TFLITE_RUNTIME),                           # Coral's official set
    ({"tflite-runtime": "2.14.0", "ai-edge-litert": "2.3.0"}, AI_EDGE_LITERT),   # PyPI's last, paired with nothing
    ({"ai-edge-litert": "2.3.0"}, AI_EDGE_LITERT),                                # dev, CI
])
def test_preference(monkeypatch, packages, first):
    monkeypatch.setattr(litert.metadata, "version", installed(packages))
    assert preference()[0] == first


def test_reports_the_runtime_in_use():
    rt = runtime()
    assert (rt.name, rt.version) == ("ai-edge-litert", metadata.version("ai-edge-litert"))
    assert rt.module.__name__ == "ai_edge_litert.interpreter"
    assert rt.load_delegate is rt.module.load_delegate
