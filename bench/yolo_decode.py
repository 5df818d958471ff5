"""The YOLO decoders (app/tasks/yolo.py) at Coral size: decode + NMS for a 320x320 head, 2,100 candidates, 80 classes.

Three layouts, int8 as an Edge TPU hands them over: Ultralytics' [1, 84, 2100] (attributes first, one scale
for boxes and scores, boxes normalized), the same transposed [1, 2100, 84], and Frigate's Coral pair
(class logits [1, 2100, 80], DFL distributions [1, 2100, 64]). The outputs look like a trained head's on a
street photo: most class scores near 0 (logits around -7), a few objects each lighting up the anchors near
them on one or two strides (about 20-60 candidates over min_score per object), boxes scattered around each
object. min_score 0.25, NMS IoU 0.45, class-aware, at most 100 objects. Beside each decoder, for scale, the
straightforward numpy decode that dequantizes and scores the whole tensor first.

Prints per layout the candidates over min_score, the objects kept, the median and p90 in ms on one thread,
and the median's ratio to the 2 ms target (below 1: inside it).

Example usage:
    python bench/yolo_decode.py -n 300
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one core, as the target says
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.model_dir.schema import DetectionSpec  # noqa: E402
from app.tasks import yolo  # noqa: E402
from app.tasks.nms import non_max_suppression  # noqa: E402
from bench.common import load_average  # noqa: E402
from bench.stats import median, percentile, ratio  # noqa: E402

SIZE = 320
CLASSES = 80
STRIDES = (8, 16, 32)
MIN_SCORE = 0.25
TARGET_MS = 2.0
INT8_SCORES = (1 / 255, -128)   # (scale, zero point) of Ultralytics' one tensor: boxes and probabilities in [0, 1]
INT8_LOGITS = (0.0625, 0)       # class logits in [-8, 8]
INT8_BINS = (0.1, -20)          # DFL bin logits


def scene(rng: np.random.Generator, objects: int = 6) -> list[tuple[float, float, float, float, int]]:
    """A few objects: centre x, y, width, height in input pixels, and a class."""
    found = []
    for _ in range(objects):
        w, h = rng.uniform(24, 160, 2)
        x, y = rng.uniform(w / 2, SIZE - w / 2), rng.uniform(h / 2, SIZE - h / 2)
        found.append((x, y, w, h, int(rng.integers(CLASSES))))
    return found


def head_logits(rng: np.random.Generator, objects) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per anchor: class logits [N, C], and the box (centre x, y, width, height, pixels) it predicts [N, 4];
    the anchors' centres and strides."""
    centres, steps = yolo.anchors(SIZE, SIZE, STRIDES)
    points = centres * steps[:, None]
    n = len(steps)
    logits = rng.normal(-7.0, 1.5, (n, CLASSES))
    boxes = np.column_stack([points, steps * 4, steps * 4]) + rng.normal(0, 2, (n, 4))
    for x, y, w, h, label in objects:
        fits = np.abs(np.log(max(w, h) / (steps * 8))) < 0.9      # the strides whose cells suit its size
        near = (np.abs(points[:, 0] - x) < w / 4) & (np.abs(points[:, 1] - y) < h / 4) & fits
        k = int(near.sum())
        logits[near, label] = rng.normal(1.0, 1.5, k)
        boxes[near] = np.column_stack([rng.normal(x, w * 0.06, k), rng.normal(y, h * 0.06, k),
                                       rng.normal(w, w * 0.08, k), rng.normal(h, h * 0.08, k)])
    return logits, boxes, steps


def quantize(real: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return np.clip(np.round(real / scale) + zero_point, -128, 127).astype(np.int8)


def ultralytics_output(seed: int, transposed: bool = False) -> np.ndarray:
    """[1, 84, 2100] int8 (or [1, 2100, 84]): xywh normalized, then the class probabilities."""
    rng = np.random.default_rng(seed)
    logits, boxes, _ = head_logits(rng, scene(rng))
    rows = np.column_stack([boxes / SIZE, 1 / (1 + np.exp(-logits))])   # [N, 84]
    q = quantize(rows, *INT8_SCORES)
    return q[None] if transposed else np.ascontiguousarray(q.T)[None]


def frigate_outputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class logits [1, 2100, 80] and DFL bins [1, 2100, 64], int8, for the same kind of scene."""
    rng = np.random.default_rng(seed)
    logits, boxes, steps = head_logits(rng, scene(rng))
    centres, _ = yolo.anchors(SIZE, SIZE, STRIDES)
    x, y, w, h = boxes.T
    sides = np.column_stack([centres[:, 0] - (x - w / 2) / steps, centres[:, 1] - (y - h / 2) / steps,
                             (x + w / 2) / steps - centres[:, 0], (y + h / 2) / steps - centres[:, 1]])
    sides = np.clip(sides, 0, 14.9)
    bins = np.arange(16)
    dfl = -((bins[None, None, :] - sides[:, :, None]) ** 2) * 2.0 + rng.normal(0, 0.3, (len(steps), 4, 16))
    return quantize(logits, *INT8_LOGITS)[None], quantize(dfl.reshape(-1, 64), *INT8_BINS)[None]


def straightforward(spec: DetectionSpec, raw: yolo.Raw, min_score: float) -> int:
    """For scale: the whole tensor dequantized and scored first, then the same filter, boxes and NMS."""
    table = raw.dequantize(raw.values.reshape(yolo.yolo_attributes(spec), -1)).T   # [N, 84] float64
    scores = table[:, 4:]
    classes = scores.argmax(axis=1)
    best = scores[np.arange(len(scores)), classes]
    keep = best >= min_score
    cx, cy, w, h = table[keep, :4].T
    boxes = np.column_stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2])
    return len(non_max_suppression(boxes, best[keep], spec.nms_iou, classes[keep], spec.max_detections))


def layouts(seed: int) -> dict[str, tuple[DetectionSpec, dict[str, yolo.Raw]]]:
    logits, dfl = frigate_outputs(seed)
    common = dict(classes=CLASSES, min_score=MIN_SCORE)
    yolo_spec = dict(decoder="yolo", box_scale="normalized", **common)
    return {
        "ultralytics [1,84,2100]": (DetectionSpec(layout="attributes_first", **yolo_spec),
                                    {yolo.PREDICTIONS: yolo.Raw(ultralytics_output(seed), *INT8_SCORES)}),
        "ultralytics [1,2100,84]": (DetectionSpec(layout="anchors_first", **yolo_spec),
                                    {yolo.PREDICTIONS: yolo.Raw(ultralytics_output(seed, True), *INT8_SCORES)}),
        "frigate logits+DFL": (DetectionSpec(decoder="yolo_dfl", **common),
                               {yolo.CLASS_LOGITS: yolo.Raw(logits, *INT8_LOGITS),
                                yolo.BOX_DISTRIBUTIONS: yolo.Raw(dfl, *INT8_BINS)}),
    }


def timed(function, rounds: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--rounds", type=int, default=300, help="timed decodes per layout and scene")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted decodes first")
    parser.add_argument("--scenes", type=int, default=5, help="scenes (seeds) per layout; the rounds spread over them")
    args = parser.parse_args(argv)

    print(f"YOLO decode + NMS, {SIZE}x{SIZE}, {yolo.anchor_count(SIZE, SIZE, STRIDES)} candidates, {CLASSES} classes, "
          f"int8, min_score {MIN_SCORE}; {args.scenes} scenes x {args.rounds // args.scenes} rounds, 1 thread, "
          f"load {load_average()}")
    print(f"{'layout':<26} {'over min':>8} {'kept':>5} {'p50 ms':>7} {'p90 ms':>7} {'p50/target':>10} "
          f"{'whole-tensor p50':>16}")
    inside = True
    for name in layouts(0):
        times, whole, over, kept = [], [], [], []
        for seed in range(args.scenes):
            spec, outputs = layouts(seed)[name]
            rows = yolo.decode(spec, outputs, SIZE, SIZE)
            kept.append(len(rows))
            best = yolo.scores_of(*_best(spec, outputs))
            over.append(int((best >= MIN_SCORE).sum()))
            times += timed(lambda: yolo.decode(spec, outputs, SIZE, SIZE), args.rounds // args.scenes, args.warmup)
            if spec.decoder == "yolo" and spec.layout == "attributes_first":
                raw = outputs[yolo.PREDICTIONS]
                whole += timed(lambda: straightforward(spec, raw, MIN_SCORE), args.rounds // args.scenes, args.warmup)
        p50 = median(times)
        inside &= p50 < TARGET_MS
        print(f"{name:<26} {np.mean(over):8.0f} {np.mean(kept):5.1f} {p50:7.3f} {percentile(times, 90):7.3f} "
              f"{ratio(p50, TARGET_MS):10.2f} {f'{median(whole):.3f}' if whole else '-':>16}")
    print(f"target: decode + NMS under {TARGET_MS} ms on one core: {'met' if inside else 'NOT met'} on this machine")
    return 0


def _best(spec: DetectionSpec, outputs: dict[str, yolo.Raw]) -> tuple[yolo.Raw, np.ndarray, str]:
    """The tensor holding the class scores, each candidate's best quantized class score, and its activation."""
    if spec.decoder == "yolo":
        raw = outputs[yolo.PREDICTIONS]
        table = yolo.yolo_table(spec, raw)
        best = table[4:].max(axis=0) if spec.layout == "attributes_first" else table[:, 4:].max(axis=1)
        return raw, best, spec.score_activation
    raw = outputs[yolo.CLASS_LOGITS]
    return raw, raw.values.reshape(-1, spec.classes).max(axis=1), spec.score_activation


if __name__ == "__main__":
    sys.exit(main())
