"""The numpy emulator against TFLite's own kernels, on the default model (or any --model) and a real photo, 1 thread.

In one process and one run, interleaved (each round runs every engine once, so drift on a noisy
machine hits all alike): the emulator (app/emulator) with its numba kernels when installed and on
numpy alone, and ai-edge-litert's interpreter with
the reference kernels (BUILTIN_REF, what the emulator is bit-exact with), the optimized builtin
kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES) and the default (XNNPACK). Prints median and p90
invoke times, the ratios, whether the emulator's output equals BUILTIN_REF's byte for byte, and
memory:
- emulator peak: the largest numpy memory alive during one invoke (tracemalloc, which numpy
  reports its buffers to), i.e. activations and temporaries, plus the prepared weights;
- RSS growth: resident memory added by creating the engine and running it once (/proc), which
  is the only view of the TFLite interpreters' native arenas.
BLAS runs on one thread (OPENBLAS_NUM_THREADS=1, set here before numpy is imported), like
the emulator's own setting and the interpreters' num_threads=1.

Example usage:
    python bench/emulator_bench.py -n 30
    python bench/emulator_bench.py --photo my.jpg --json
    python bench/emulator_bench.py --model detector_int8.tflite -n 20   # any model: the photo resized to its input

With --model, the photo is resized to each input's size (bilinear, no normalisation: the bytes are the
pixels, shifted by 128 for an int8 input) and every output is compared with BUILTIN_REF's.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: BLAS reads it once, at load

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import default_photo, repo_root  # noqa: E402
from bench.stats import median, percentile, ratio  # noqa: E402

MODEL = "efficientnet_lite0"
MAX_PIXELS = 50_000_000
MIB = 1024 * 1024


def rss_bytes() -> int:
    """Current resident set size, from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Engine:
    """One way to run the model: name, run(x) -> output, and how much memory it took to set up."""

    def __init__(self, name: str, create, x: np.ndarray, roles: dict[str, int] | None = None):
        before = rss_bytes()
        start = time.perf_counter()
        self.interpreter = create()
        self.interpreter.allocate_tensors()
        self.input_index = self.interpreter.get_input_details()[0]["index"]
        self.output_index = self.interpreter.get_output_details()[0]["index"]
        self.load_ms = (time.perf_counter() - start) * 1000
        self.run(x)
        self.first_output = compared_bytes(self.interpreter, roles or {})
        self.rss_growth = rss_bytes() - before
        self.name = name
        self.times_ms: list[float] = []

    def run(self, x: np.ndarray) -> np.ndarray:
        self.interpreter.set_tensor(self.input_index, x)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output_index)

    def timed(self, x: np.ndarray) -> None:
        start = time.perf_counter()
        self.run(x)
        self.times_ms.append((time.perf_counter() - start) * 1000)


def detector_outputs(path: Path) -> dict[str, int]:
    """Role -> tensor index of a detector's post-process outputs; {} for other models."""
    from app.detection_postprocess import PostProcessError, outputs_by_role
    from app.tflite_file import read_tflite

    try:
        return {role: tensor.index for role, tensor in outputs_by_role(read_tflite(path).graph).items()}
    except PostProcessError:
        return {}


def compared_bytes(interpreter, roles: dict[str, int]) -> bytes:
    """Every output's bytes; for a detector only the rows its count says were written (TFLite leaves the others
    as its memory was, the emulator writes zeros: docs/emulator.md)."""
    if not roles:
        return b"".join(interpreter.get_tensor(d["index"]).tobytes() for d in interpreter.get_output_details())
    count = int(interpreter.get_tensor(roles["count"]).reshape(-1)[0])
    return b"".join([interpreter.get_tensor(roles["count"]).tobytes()]
                    + [interpreter.get_tensor(roles[r])[0, :count].tobytes() for r in ("boxes", "classes", "scores")])


def resized_photo_tensor(photo: Path, model: Path) -> np.ndarray:
    """The photo at the model's input size, as its input type holds pixels (int8: shifted by 128)."""
    from PIL import Image

    from app.tflite_file import read_tflite

    graph = read_tflite(model).graph
    tensor = graph.tensors[graph.inputs[0]]
    _, height, width, _ = tensor.shape
    pixels = np.asarray(Image.open(photo).convert("RGB").resize((width, height), Image.BILINEAR), np.int16)
    return (pixels - (128 if tensor.type == "INT8" else 0)).reshape(tensor.shape).astype(tensor.dtype)


def photo_tensor(photo: Path) -> np.ndarray:
    from app.imaging import prepare
    from app.imaging.quantization import InputQuantizer
    from app.model_dir.reading import read_model_dir

    model_dir = read_model_dir(repo_root() / "models" / MODEL)
    spec = model_dir.manifest.input
    return InputQuantizer(spec, np.dtype(np.uint8), 1 / 128, 127)(prepare(photo.read_bytes(), spec, MAX_PIXELS))


def emulator_peak_bytes(engine: Engine, x: np.ndarray, path: Path) -> tuple[int, int]:
    """(prepared model, peak during one invoke above it): numpy memory seen by tracemalloc."""
    from app.emulator import Interpreter

    tracemalloc.start()
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    prepared, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    interpreter.set_tensor(engine.input_index, x)
    interpreter.invoke()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return prepared, peak - prepared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photo", type=Path, default=None, help="photo to classify (default: scikit-learn's china.jpg)")
    parser.add_argument("-n", "--rounds", type=int, default=30, help="measured rounds (one invoke per engine each)")
    parser.add_argument("--warmup", type=int, default=3, help="uncounted rounds first")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--model", type=Path, default=None,
                        help=f"a .tflite to run instead of the default model ({MODEL}); the photo is resized to "
                             "its input")
    args = parser.parse_args()

    from ai_edge_litert.interpreter import Interpreter as LiteRt
    from ai_edge_litert.interpreter import OpResolverType

    from app.emulator import Interpreter as Emulator

    path = args.model or repo_root() / "models" / MODEL / f"{MODEL}_int8.tflite"
    name = path.stem if args.model else MODEL
    photo = args.photo or default_photo()
    x = resized_photo_tensor(photo, path) if args.model else photo_tensor(photo)
    roles = detector_outputs(path)

    def litert(resolver):
        return lambda: LiteRt(model_path=str(path), num_threads=1, experimental_op_resolver_type=resolver)

    from app.emulator import accel

    engines = [
        Engine("emulator" + (" (numba kernels)" if accel.available() else " (numpy)"),
               lambda: Emulator(model_path=path, num_threads=1), x, roles),
        Engine("reference (BUILTIN_REF)", litert(OpResolverType.BUILTIN_REF), x, roles),
        Engine("optimized (BUILTIN_WITHOUT_DEFAULT_DELEGATES)", litert(OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
               x, roles),
        Engine("XNNPACK (AUTO)", litert(OpResolverType.AUTO), x, roles),
    ]
    if accel.available():
        engines.append(Engine("emulator (numpy only)", lambda: Emulator(model_path=path, num_threads=1,
                                                                        accelerate=False), x, roles))
    emulator, reference, optimized, xnnpack = engines[:4]
    identical = all(e.first_output == reference.first_output for e in engines
                    if e.name.startswith("emulator"))
    prepared, invoke_peak = emulator_peak_bytes(emulator, x, path)

    for _ in range(args.warmup):
        for engine in engines:
            engine.run(x)
    for _ in range(args.rounds):
        for engine in engines:
            engine.timed(x)

    medians = {e.name: median(e.times_ms) for e in engines}
    emulator_ms = medians[emulator.name]
    figures = {
        "model": name, "photo": photo.name, "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "byte_identical_to_builtin_ref": identical,
        "engines": {e.name: {"p50_ms": medians[e.name], "p90_ms": percentile(e.times_ms, 90), "load_ms": e.load_ms,
                             "rss_growth_mib": e.rss_growth / MIB} for e in engines},
        "emulator": emulator.name,
        "emulator_speedup_vs_reference": ratio(medians[reference.name], emulator_ms),
        "emulator_over_optimized": ratio(emulator_ms, medians[optimized.name]),
        "emulator_over_xnnpack": ratio(emulator_ms, medians[xnnpack.name]),
        "emulator_prepared_mib": prepared / MIB,
        "emulator_invoke_peak_mib": invoke_peak / MIB,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0 if identical else 1
    print(f"{name}, photo {photo.name}, {args.rounds} interleaved rounds, 1 thread, {figures['machine']}")
    print(f"{'engine':<48} {'p50 ms':>8} {'p90 ms':>8} {'load ms':>8} {'RSS +MiB':>9}")
    print("(load: create + allocate; the emulator reads, checks and prepares the whole graph there)")
    for e in engines:
        row = figures["engines"][e.name]
        print(f"{e.name:<48} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f} {row['load_ms']:8.1f} "
              f"{row['rss_growth_mib']:9.1f}")
    print(f"emulator output byte-identical to BUILTIN_REF: {identical}")
    print(f"ratios for {emulator.name}:")
    print(f"emulator speed-up vs reference kernels: {figures['emulator_speedup_vs_reference']:.2f}x (target >= 5x)")
    print(f"emulator time / optimized kernels: {figures['emulator_over_optimized']:.2f}x (target <= 2x)")
    print(f"emulator time / XNNPACK: {figures['emulator_over_xnnpack']:.2f}x")
    print(f"emulator memory: prepared model {figures['emulator_prepared_mib']:.1f} MiB (float weights, tables), "
          f"peak during one invoke {figures['emulator_invoke_peak_mib']:.1f} MiB above it (activations, temporaries)")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
