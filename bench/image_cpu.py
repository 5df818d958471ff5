"""CPU ms per inference inside an image's container, beside the dev venv's, in one run.

The same timing code runs in both places: each default model's int8 file on ai-edge-litert's CPU
path (XNNPACK, one thread: the service's CPU_THREADS default), a real photo's tensor, warm-up
invokes first, then the median of N invokes; alternating venv and container rounds so drift on a
shared machine hits both alike. An arm64 image on an x86-64 host runs under QEMU (a Cortex-A53
model): its figure is QEMU's speed, not the board's, and is shown for what it is.

Example usage:
    python bench/image_cpu.py --image edgetpu-serve:latest
    python bench/image_cpu.py --image edgetpu-serve:devboard --arm64 -n 20 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
A53 = ROOT / "docker" / "tools" / "qemu-cortex-a53"
MODELS = ("efficientnet_lite0", "mobilenet_v2", "fashion_mnist")

TIMING = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from ai_edge_litert.interpreter import Interpreter
from app.imaging import prepare
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from app.model_dir.schema import int8_filename
models, photo, n, warmup = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
found = {}
for name in sys.argv[5:]:
    directory = models / name
    spec = read_model_dir(directory).manifest.input
    interpreter = Interpreter(str(directory / int8_filename(name)), num_threads=1)
    interpreter.allocate_tensors()
    given = interpreter.get_input_details()[0]
    scale, zero_point = given["quantization"]
    tensor = InputQuantizer(spec, given["dtype"], scale, zero_point)(prepare(photo.read_bytes(), spec, 50_000_000))
    interpreter.set_tensor(given["index"], tensor.reshape(given["shape"]))
    for _ in range(warmup):
        interpreter.invoke()
    times = []
    for _ in range(n):
        started = time.perf_counter_ns()
        interpreter.invoke()
        times.append((time.perf_counter_ns() - started) / 1e6)
    found[name] = times
print(json.dumps(found))
"""


def run_venv(n: int, warmup: int, photo: Path) -> dict[str, list[float]]:
    done = subprocess.run([sys.executable, "-c", TIMING, str(ROOT / "models"), str(photo), str(n), str(warmup), *MODELS],
                          capture_output=True, text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout)


def run_image(image: str, arm64: bool, n: int, warmup: int, photo: Path, docker: str) -> dict[str, list[float]]:
    qemu = (["-e", "QEMU_CPU=cortex-a53", "-v", f"{A53 / 'cpuinfo'}:/proc/cpuinfo:ro",
             "-v", f"{A53 / 'sys/devices/system/cpu'}:/sys/devices/system/cpu:ro"] if arm64 else [])
    done = subprocess.run([docker, "run", "--rm", "--network=none", *qemu, "-e", "PYTHONPATH=/srv/edgetpu-serve",
                           "-v", f"{photo}:/photo:ro", image, "python", "-c", TIMING, "/models", "/photo", str(n),
                           str(warmup), *MODELS], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="edgetpu-serve:latest", help="the image to time")
    parser.add_argument("--arm64", action="store_true", help="the image is arm64: run it as a Cortex-A53 under QEMU")
    parser.add_argument("-n", type=int, default=100, help="timed invokes per model and round")
    parser.add_argument("--warmup", type=int, default=10, help="untimed invokes first")
    parser.add_argument("--rounds", type=int, default=3, help="alternating venv/container rounds")
    parser.add_argument("--photo", type=Path, default=None, help="the photo whose tensor is timed (default china.jpg)")
    parser.add_argument("--docker", default="/usr/bin/docker", help="the docker client")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.stats import median
    from converter.photos import photo
    picture = (args.photo or photo("scikit-learn", "sklearn/datasets/images/china.jpg")).resolve()
    venv: dict[str, list[float]] = {m: [] for m in MODELS}
    image: dict[str, list[float]] = {m: [] for m in MODELS}
    for _ in range(args.rounds):
        for name, times in run_venv(args.n, args.warmup, picture).items():
            venv[name] += times
        for name, times in run_image(args.image, args.arm64, args.n, args.warmup, picture, args.docker).items():
            image[name] += times
    where = "QEMU Cortex-A53" if args.arm64 else "container"
    print(f"CPU ms per inference (ai-edge-litert XNNPACK, 1 thread), median of {args.rounds} x {args.n}: "
          f"venv vs {args.image} ({where})")
    print(f"{'model':<20} {'venv':>9} {'image':>9} {'image/venv':>11}")
    for name in MODELS:
        a, b = median(venv[name]), median(image[name])
        print(f"{name:<20} {a:>9.3f} {b:>9.3f} {b / a:>10.2f}x")


if __name__ == "__main__":
    main()
