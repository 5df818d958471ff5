"""The face tasks' work after the model, per request: a face detector's decode against its priors (the detection
task's `read`: dequantize, face probabilities, decode of the candidates, NMS, boxes and landmarks to the photo's
pixels) and an embedder's vector (the embedding task's `read`: dequantize, L2-normalize).

The outputs are real ones: the tests' tiny models (tests/face_models.py, tests/face_import_models.py) in ULFD's
shapes at 320x240 (4420 priors: what RFB-320 and slim give) in its four forms, a RetinaFace-style detector with
landmarks, and MobileFaceNet's 128-value embedder, run once each on TFLite's CPU kernels on photos with 0 to 4
faces; then only the task's read is timed, on one thread. Beside each, the model's own invoke on the CPU for
scale (an Edge TPU's is a few ms).

Prints per model the faces found, the read's median and p90 in ms, and the CPU invoke's median.

Example usage:
    python bench/face_decode.py -n 300
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one core
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.imaging.geometry import Geometry, to_pixels  # noqa: E402
from app.tasks.base import Outputs  # noqa: E402
from bench.common import load_average  # noqa: E402
from bench.stats import median, percentile  # noqa: E402
from converter.importer import ImportOptions, import_model  # noqa: E402
from converter.local_models import LocalModel  # noqa: E402
from tests.face_import_models import retinaface_like  # noqa: E402
from tests.face_models import draw_face, face_photo, tiny_face_detector, tiny_face_embedder  # noqa: E402

DETECTORS = {"ulfd (raw, softmax)": ("priors", "softmax"), "ulfd (raw, logits)": ("priors", "logits"),
             "ulfd is_test (corners)": ("decoded", "softmax"), "ulfd is_test (logits)": ("decoded", "logits")}
SCENES = [[], [(0, 1, (40, 60, 48))], [(1, 2, (200, 100, 48)), (2, 3, (131, 170, 48))],
          [(3, 4, (0, 0, 48)), (4, 5, (272, 192, 48)), (5, 6, (150, 10, 48)), (6, 7, (7, 185, 48))]]


def timed(call, rounds: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return times


def imported(root: Path, name: str, data: bytes, **options) -> LocalModel:
    source = root / f"{name}.tflite"
    source.write_bytes(data)
    import_model([source], ImportOptions(name=name, out=root / "models", **options))
    return LocalModel.open(root / "models" / name, "cpu")


def bench(model: LocalModel, images, rounds: int) -> tuple[float, list[float], list[float]]:
    """(objects per image, the read's times, the invoke's times) over the images."""
    found, reads, invokes = [], [], []
    per_image = max(1, rounds // len(images))
    spec = model.model_dir.manifest.input
    for image in images:
        tensor = model.quantizer(to_pixels(image, spec))
        tensors = model.engine.run([tensor])
        outputs = Outputs(tensors, model.roles, model.model_dir, Geometry.identity(*image.size))
        options = model.task.options()
        result = model.task.read(outputs, options)
        found.append(len(getattr(result, "detections", [result])))
        reads += timed(lambda: model.task.read(outputs, options), per_image)
        invokes += timed(lambda: model.engine.run([tensor]), max(1, per_image // 10), 1)
    return sum(found) / len(found), reads, invokes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--rounds", type=int, default=300, help="reads timed per model (default 300)")
    args = parser.parse_args(argv)
    print(f"the face tasks' read per request, one thread; load {load_average()}")
    print(f"{'model':<30} {'found':>5} {'p50 ms':>7} {'p90 ms':>7} {'invoke p50 ms (cpu)':>20}")
    photos = [face_photo(scene, seed=i)[0] for i, scene in enumerate(SCENES)]
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        models = {name: (imported(root, f"d{i}", tiny_face_detector(*form)), photos)
                  for i, (name, form) in enumerate(DETECTORS.items())}
        models["retinaface-style (landmarks)"] = (imported(root, "retina", retinaface_like()), photos)
        models["mobilefacenet (embedding)"] = (imported(root, "mfn", tiny_face_embedder(), task="embedding"),
                                               [draw_face(k, 1).image for k in range(4)])
        for name, (model, images) in models.items():
            with model:
                found, reads, invokes = bench(model, images, args.rounds)
            print(f"{name:<30} {found:5.2f} {median(reads):7.3f} {percentile(reads, 90):7.3f} {median(invokes):20.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
