"""How much slower the same image work runs on a thread that slept just before it.

At concurrency 1 every thread of the service sleeps between requests (the image thread while the device
works, the loop while both do). A virtual machine's idle vCPU, or a board's CPU frequency governor,
makes the first work after a sleep slower: caches and predictors cold, the clock low. This measures it
directly, back to back and after sleeps of a few ms (median thread CPU time per call, the sleep lengths
in alternating rounds): the default model's whole image work (decode, crop and resize, quantize) on the
224x224 JPEG that bench/device_capacity.py sends, and its post-processing (dequantize, softmax and top 5
of a real output vector).

    python bench/idle_penalty.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.device_capacity import MAX_PIXELS, MODEL, jpeg_224  # noqa: E402
from bench.common import repo_root  # noqa: E402
from bench.stats import median  # noqa: E402

SLEEPS_MS = (0.0, 0.5, 2.0, 4.0, 10.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100, help="calls per sleep length per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from app.imaging import prepare
    from app.imaging.decoding import reuse_image_buffers
    from app.imaging.quantization import InputQuantizer
    from app.tasks.classify import scores, top_predictions
    from app.model_dir.reading import read_model_dir

    model_dir = read_model_dir(repo_root() / "models" / MODEL)
    spec, tensor = model_dir.manifest.input, model_dir.manifest.quantization.input
    quantizer = InputQuantizer(spec, tensor.dtype, tensor.scale, tensor.zero_point)
    reuse_image_buffers()
    jpeg = jpeg_224()
    output = np.random.default_rng(0).integers(0, 256, (1, len(model_dir.labels)), dtype=np.uint8)
    work = {"image work": lambda: quantizer(prepare(jpeg, spec, MAX_PIXELS)),
            "post-processing": lambda: top_predictions(scores(output, 0.1, 0, model_dir), model_dir.labels, 5, 0.0)}
    times = {(name, s): [] for name in work for s in SLEEPS_MS}
    for fn in work.values():
        for _ in range(20):
            fn()
    for _ in range(args.rounds):
        for sleep_ms in SLEEPS_MS:
            for name, fn in work.items():
                for _ in range(args.n):
                    if sleep_ms:
                        time.sleep(sleep_ms / 1000)
                    start = time.thread_time()
                    fn()
                    times[name, sleep_ms].append(time.thread_time() - start)
    print("| sleep before each call, ms | " + " | ".join(f"{name}: CPU ms (median), against back to back"
                                                         for name in work) + " |")
    print("|---|" + "---|" * len(work))
    for sleep_ms in SLEEPS_MS:
        cells = []
        for name in work:
            middle, hot = (median(times[name, s]) for s in (sleep_ms, 0.0))
            cells.append(f"{middle * 1000:.3f} ({middle / hot:.1f}x)")
        print(f"| {sleep_ms:g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
