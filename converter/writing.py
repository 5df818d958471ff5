"""A new int8 model's directory, from what a route hands over: the file, its labels and what the route knows
about it, measured and recorded here (app/model_dir/writing.py writes it whole; `import` and `segment` call that
directly with their own records).

The recipes (converter/builds.py) and `python -m converter quantize` (every route: Keras,
SavedModel, PyTorch, ONNX) hand over the int8 model, its labels and what they know about it;
this module measures what the file itself says (operators, I/O quantization, the offline Edge
TPU analysis) and writes the directory whole.
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from app.model_dir.records import Quality
from app.model_dir.schema import Build, InputSpec, Manifest, OutputSpec, int8_filename
from converter.model_dir import write_model_dir

LABELS_FILE = "labels.txt"
CPUINFO = Path("/proc/cpuinfo")
# The instruction sets TensorFlow's CPU kernels (Eigen, oneDNN, XNNPACK) pick their code paths by. Training with
# one seed, deterministic ops and fixed thread counts gives the same weights bit for bit only where these match:
# an AVX-512 machine sums in another order than an AVX2 one.
KERNEL_ISA = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
              "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16")


def tool_versions(*distributions: str) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def cpu_kind(cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """The kind of CPU a build ran on, as far as it decides the bytes: architecture and kernel instruction sets.

    Recorded in model.json (build.cpu) so that a rebuild knows whether it may expect the committed bytes.
    """
    model, flags = "", set()
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return {"machine": platform.machine(), "model": model,
            "isa": " ".join(name for name in KERNEL_ISA if name in flags)}


def same_cpu_kind(a: dict[str, str] | None, b: dict[str, str] | None) -> bool:
    """Whether two builds' CPUs pick the same kernel code paths (the model name alone may differ or be masked)."""
    return bool(a and b) and (a.get("machine"), a.get("isa")) == (b.get("machine"), b.get("isa"))


def write_int8_model(out_root: Path, name: str, tflite: bytes, labels: list[str], spec: InputSpec, *,
                     description: str, source: str, licence: str, build: Build, scores: str = "logits",
                     quality: Quality | None = None, quantization: dict | None = None,
                     task: str = "classification", outputs: dict[str, str] | None = None) -> Path:
    """Write models/<name>/ (model.json, labels.txt, <name>_int8.tflite); returns the directory.

    quantization: converter.quantize.describe(tflite), when the caller has it already (a detector's:
    converter.detection.describe). task and outputs: model.json's, for a model that is not a classifier.
    """
    from app.edgetpu.compat import analyze
    from app.tflite_file import read_tflite
    from converter.estimate import estimate_tflite_bytes
    from converter.quantize import describe

    manifest = Manifest(
        name=name, task=task, outputs=outputs or {}, description=description, source=source, licence=licence,
        input=spec, output=OutputSpec(scores=scores), quantization=quantization or describe(tflite),
        edgetpu_analysis=analyze(read_tflite(tflite)).summary(), quality=quality, build=build,
        edgetpu_estimate=estimate_tflite_bytes(tflite),
    )
    return write_model_dir(out_root, manifest, {
        "int8": (int8_filename(name), tflite),
        "labels": (LABELS_FILE, ("\n".join(labels) + "\n").encode()),
    })
