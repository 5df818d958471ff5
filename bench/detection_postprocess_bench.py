"""TFLite_Detection_PostProcess on the emulator against TFLite's own kernel, at SSD MobileNet size, beside a network.

The op alone with 1917 anchors and 91 score columns (90 classes and the background), uint8 inputs
as Coral's quantized SSD MobileNet hands them over (SSD-like scores from tests/detection_models.py:
most near 0, a few objects), in three configurations: fast NMS with 10 and 100 detections (Coral's
and the TF object-detection exports use fast NMS) and regular NMS with 100. In one process,
interleaved rounds: the emulator, and the pinned runtime's kernel (BUILTIN_REF, one thread). For
scale, the emulator also runs the default model (EfficientNet-Lite0 224, about half an SSD MobileNet
v2 300's multiply-adds) on a photo: the network such an op follows costs at least that much.
Prints medians and p90, the op's time over the network's, and whether the emulator's detections
equal the kernel's.

Example usage:
    python bench/detection_postprocess_bench.py -n 30
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: BLAS reads it once, at load

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import default_photo, load_average, repo_root  # noqa: E402
from bench.emulator_bench import MODEL, photo_tensor  # noqa: E402
from bench.stats import median, percentile, ratio  # noqa: E402

CONFIGURATIONS = {  # name -> the op's options
    "fast NMS, 10 detections": dict(use_regular_nms=False, max_detections=10),
    "fast NMS, 100 detections": dict(use_regular_nms=False, max_detections=100),
    "regular NMS, 100 detections": dict(use_regular_nms=True, max_detections=100, detections_per_class=100),
}


class Runner:
    """One interpreter with its inputs set: timed invokes, and its outputs."""

    def __init__(self, interpreter, inputs: list[np.ndarray]):
        self.interpreter, self.times_ms = interpreter, []
        interpreter.allocate_tensors()
        for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
            interpreter.set_tensor(detail["index"], x)

    def timed(self) -> None:
        start = time.perf_counter()
        self.interpreter.invoke()
        self.times_ms.append((time.perf_counter() - start) * 1000)

    def detections(self) -> bytes:
        """count, then the boxes, classes and scores of the first count rows (the rows a client reads)."""
        boxes, classes, scores, count = (self.interpreter.get_tensor(d["index"])
                                         for d in self.interpreter.get_output_details())
        n = int(count[0])
        return count.tobytes() + boxes[0, :n].tobytes() + classes[0, :n].tobytes() + scores[0, :n].tobytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--rounds", type=int, default=30, help="measured rounds (one invoke per runner each)")
    parser.add_argument("--warmup", type=int, default=3, help="uncounted rounds first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the SSD-like scores")
    args = parser.parse_args()

    from ai_edge_litert.interpreter import Interpreter as LiteRt
    from ai_edge_litert.interpreter import OpResolverType

    from app.emulator import Interpreter as Emulator
    from tests.detection_models import ENCODINGS_Q, SCORES_Q, postprocess_alone, ssd_anchors, ssd_like_head

    anchors = ssd_anchors()
    inputs = list(ssd_like_head(args.seed, anchors, 90))
    runners = {}
    for name, options in CONFIGURATIONS.items():
        model = postprocess_alone(anchors, 91, encodings="UINT8", predictions="UINT8", encodings_q=ENCODINGS_Q,
                                  predictions_q=SCORES_Q, num_classes=90, nms_score_threshold=1e-8,
                                  nms_iou_threshold=0.6, **options)
        runners[name] = (Runner(Emulator(model_content=model, num_threads=1), inputs),
                         Runner(LiteRt(model_content=model, num_threads=1,
                                       experimental_op_resolver_type=OpResolverType.BUILTIN_REF), inputs))
    network = Runner(Emulator(model_path=repo_root() / "models" / MODEL / f"{MODEL}_int8.tflite", num_threads=1),
                     [photo_tensor(default_photo())])
    everything = [runner for pair in runners.values() for runner in pair] + [network]
    for _ in range(args.warmup):
        for runner in everything:
            runner.interpreter.invoke()
    for _ in range(args.rounds):
        for runner in everything:
            runner.timed()

    network_ms = median(network.times_ms)
    print(f"TFLite_Detection_PostProcess, 1917 anchors x 91 columns, uint8 inputs; {args.rounds} interleaved rounds, "
          f"1 thread, {os.cpu_count()} cores, load {load_average()}")
    print(f"{'configuration':<30} {'emulator p50':>12} {'p90':>7} {'kernel p50':>11} {'p90':>7} "
          f"{'emu/kernel':>10} {'emu/network':>11} {'equal':>6}")
    identical = True
    for name, (emulator, kernel) in runners.items():
        equal = emulator.detections() == kernel.detections()
        identical &= equal
        emulator_ms, kernel_ms = median(emulator.times_ms), median(kernel.times_ms)
        print(f"{name:<30} {emulator_ms:12.2f} {percentile(emulator.times_ms, 90):7.2f} {kernel_ms:11.2f} "
              f"{percentile(kernel.times_ms, 90):7.2f} {ratio(emulator_ms, kernel_ms):10.2f} "
              f"{ratio(emulator_ms, network_ms):11.3f} {str(equal):>6}")
    print(f"network for scale: {MODEL} on the emulator, p50 {network_ms:.2f} ms, p90 "
          f"{percentile(network.times_ms, 90):.2f} ms (an SSD MobileNet v2 300 does about twice its multiply-adds)")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
