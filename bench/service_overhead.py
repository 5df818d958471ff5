"""What the service costs on top of the interpreter, for one photo, one request at a time.

In one run, in alternating blocks (so drift on a noisy machine hits both alike): the raw
engine run of the default model on the photo's tensor, and the end-to-end HTTP latency of
POSTing the same photo to the service (one keep-alive connection, sequential), plus the
stage timings the service reports itself. The difference
of the medians is the service's overhead; the image work (decode + preprocess) is shown
apart because it is real work, not framework cost.

Example usage:
    python bench/service_overhead.py -n 300
    python bench/service_overhead.py --photo my.jpg --backend emulated --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_service, default_photo, repo_root  # noqa: E402
from bench.stats import percentile  # noqa: E402

MODEL = "efficientnet_lite0"
PERCENTILES = (50, 90, 99)
MAX_PIXELS = 50_000_000
STAGES = ("decode", "preprocess", "inference", "postprocess", "total")
BLOCKS = 10


class RawEngine:
    """The engine alone: one interpreter, the photo already a tensor."""

    def __init__(self, backend: str, photo: bytes):
        from app.engines import ENGINES, EngineOptions
        from app.imaging import prepare
        from app.imaging.quantization import InputQuantizer
        from app.model_dir.reading import read_model_dir

        model_dir = read_model_dir(repo_root() / "models" / MODEL)
        engine_cls = ENGINES[backend]
        self.engine = engine_cls.load(model_dir.file(engine_cls.model_file), EngineOptions(cpu_threads=1))
        spec = self.engine.inputs[0]
        quantizer = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
        self.tensor = quantizer(prepare(photo, model_dir.manifest.input, MAX_PIXELS))

    def run_ms(self) -> float:
        start = time.perf_counter()
        self.engine.run([self.tensor])
        return (time.perf_counter() - start) * 1000


class HttpClient:
    """Sequential POSTs of the photo on one keep-alive connection."""

    def __init__(self, port: int, backend: str, photo: bytes):
        self.connection = http.client.HTTPConnection("127.0.0.1", port)
        self.path = f"/v1/models/{MODEL}/classify?top_k=5&backend={backend}"
        self.photo = photo

    def post(self) -> tuple[float, dict | None]:
        """Client-side ms, and the service's timing_ms (None for a non-200 answer)."""
        start = time.perf_counter()
        self.connection.request("POST", self.path, body=self.photo, headers={"Content-Type": "image/jpeg"})
        response = self.connection.getresponse()
        body = response.read()
        elapsed = (time.perf_counter() - start) * 1000
        return elapsed, json.loads(body)["timing_ms"] if response.status == 200 else None


def measure(raw: RawEngine, client: HttpClient, count: int, warmup: int):
    """count raw runs and count requests, in BLOCKS alternating blocks, after warmup of each."""
    for _ in range(warmup):
        raw.run_ms()
        client.post()
    raw_ms, client_ms, stages, errors = [], [], {s: [] for s in STAGES}, 0
    per_block = max(1, count // BLOCKS)
    while len(raw_ms) < count:
        block = min(per_block, count - len(raw_ms))
        raw_ms += [raw.run_ms() for _ in range(block)]
        for _ in range(block):
            elapsed, timing = client.post()
            if timing is None:
                errors += 1
                continue
            client_ms.append(elapsed)
            for s in STAGES:
                stages[s].append(timing[s])
    return raw_ms, client_ms, stages, errors


def percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{p}": percentile(values, p) for p in PERCENTILES} | {"mean": float(np.mean(values))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photo", type=Path, default=None, help="JPEG to send (default: scikit-learn's china.jpg)")
    parser.add_argument("-n", "--requests", type=int, default=200, help="measured requests and invokes")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted requests and invokes first")
    parser.add_argument("--backend", default="cpu", help="backend for both measurements")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    photo_path = args.photo or default_photo()
    photo = photo_path.read_bytes()

    raw_engine = RawEngine(args.backend, photo)
    with bench_service(workers=1, backends=args.backend) as service:
        raw, client, stages, errors = measure(raw_engine, HttpClient(service.port, args.backend, photo),
                                              args.requests, args.warmup)

    from PIL import Image

    width, height = Image.open(photo_path).size
    rows = {"raw invoke": percentiles(raw), "HTTP end to end": percentiles(client)}
    rows |= {f"service {s}": percentiles(v) for s, v in stages.items()}
    overhead = rows["HTTP end to end"]["p50"] - rows["raw invoke"]["p50"]
    image_work = rows["service decode"]["p50"] + rows["service preprocess"]["p50"]
    figures = {"photo": photo_path.name, "pixels": [width, height], "requests": args.requests, "errors": errors,
               "backend": args.backend, "machine": f"{os.cpu_count()} cores {platform.machine()}, "
               f"Python {platform.python_version()}", "ms": rows,
               "overhead_p50_ms": overhead, "image_work_p50_ms": image_work}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{photo_path.name} ({width}x{height}), {args.requests} requests after {args.warmup} warm-up, "
          f"backend {args.backend}, 1 interpreter, 1 thread; {figures['machine']}; errors: {errors}")
    print(f"{'ms':<22}" + "".join(f"{k:>9}" for k in ("p50", "p90", "p99", "mean")))
    for name, row in rows.items():
        print(f"{name:<22}" + "".join(f"{row[k]:9.2f}" for k in ("p50", "p90", "p99", "mean")))
    print(f"service overhead (p50 end to end - p50 raw invoke): {overhead:.2f} ms")
    print(f"  of which image work (p50 decode + p50 preprocess): {image_work:.2f} ms")
    print(f"  the rest (HTTP, framework, thread hops): {overhead - image_work:.2f} ms")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
