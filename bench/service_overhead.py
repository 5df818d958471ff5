"""What the service costs on top of the interpreter, for one photo, one request at a time.

In one run: the raw interpreter invoke of the default model on the photo's tensor, and the
end-to-end HTTP latency of POSTing the same photo to a running service (one keep-alive
connection, sequential), plus the stage timings the service reports itself. The difference
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

from bench.common import ServiceProcess, default_photo, repo_root  # noqa: E402

MODEL = "efficientnet_lite0"
PERCENTILES = (50, 90, 99)
MAX_PIXELS = 50_000_000
STAGES = ("decode", "preprocess", "inference", "postprocess", "total")


def raw_invoke_ms(backend: str, photo: bytes, count: int, warmup: int) -> list[float]:
    """The engine alone: one interpreter, the photo already a tensor."""
    from app.engines import ENGINES, EngineOptions
    from app.imaging import InputQuantizer, prepare
    from app.model_dir import read_model_dir

    model_dir = read_model_dir(repo_root() / "models" / MODEL)
    engine_cls = ENGINES[backend]
    engine = engine_cls.load(model_dir.file(engine_cls.model_file), EngineOptions(cpu_threads=1))
    spec = engine.input
    quantizer = InputQuantizer(model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)
    tensor = quantizer(prepare(photo, model_dir.manifest.input, MAX_PIXELS))
    times = []
    for i in range(warmup + count):
        start = time.perf_counter()
        engine.run(tensor)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return times


def http_ms(port: int, backend: str, photo: bytes, count: int, warmup: int) -> tuple[list[float], dict, int]:
    """Client-side latency per request, the service's own stage timings, and the error count."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    path = f"/v1/models/{MODEL}/classify?top_k=5&backend={backend}"
    client, stages, errors = [], {s: [] for s in STAGES}, 0
    for i in range(warmup + count):
        start = time.perf_counter()
        connection.request("POST", path, body=photo, headers={"Content-Type": "image/jpeg"})
        response = connection.getresponse()
        body = response.read()
        elapsed = (time.perf_counter() - start) * 1000
        if i < warmup:
            continue
        if response.status != 200:
            errors += 1
            continue
        client.append(elapsed)
        timing = json.loads(body)["timing_ms"]
        for s in STAGES:
            stages[s].append(timing[s])
    connection.close()
    return client, stages, errors


def percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES} | {"mean": float(np.mean(values))}


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

    raw = raw_invoke_ms(args.backend, photo, args.requests, args.warmup)
    with ServiceProcess(workers=1, backends=args.backend) as service:
        client, stages, errors = http_ms(service.port, args.backend, photo, args.requests, args.warmup)

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
