"""Every model directory the converter makes is written here, through app.model_dir's typed manifest.

The recipes (converter/builds.py) and `python -m converter quantize` (every route: Keras,
SavedModel, PyTorch, ONNX) hand over the int8 model, its labels and what they know about it;
this module measures what the file itself says (operators, I/O quantization, the offline Edge
TPU analysis) and writes the directory whole.
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from app.model_dir import Build, InputSpec, Manifest, OutputSpec, Quality, int8_filename, write_model_dir

LABELS_FILE = "labels.txt"


def tool_versions(*distributions: str) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_int8_model(out_root: Path, name: str, tflite: bytes, labels: list[str], spec: InputSpec, *,
                     description: str, source: str, licence: str, build: Build, scores: str = "logits",
                     quality: Quality | None = None, quantization: dict | None = None) -> Path:
    """Write models/<name>/ (model.json, labels.txt, <name>_int8.tflite); returns the directory.

    quantization: converter.quantize.describe(tflite), when the caller has it already.
    """
    from app.edgetpu.compat import analyze
    from app.tflite_file import read_tflite
    from converter.estimate import estimate_tflite_bytes
    from converter.quantize import describe

    manifest = Manifest(
        name=name, description=description, source=source, licence=licence, input=spec,
        output=OutputSpec(scores=scores), quantization=quantization or describe(tflite),
        edgetpu_analysis=analyze(read_tflite(tflite)).summary(), quality=quality, build=build,
        edgetpu_estimate=estimate_tflite_bytes(tflite),
    )
    return write_model_dir(out_root, manifest, {
        "int8": (int8_filename(name), tflite),
        "labels": (LABELS_FILE, ("\n".join(labels) + "\n").encode()),
    })
