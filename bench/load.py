"""Service throughput and latency under concurrency, against the raw interpreter in the same run.

For each concurrency level (default 1, 2, 4, 8) three measurements, in alternating rounds (so
drift on a noisy machine falls on all three alike), each round after a short warm-up:
  service   c keep-alive HTTP connections POSTing a real photo as fast as answers come
  pipeline  the same work without HTTP: c threads decode + preprocess (app.imaging) and
            invoke on a pool of W interpreters (W = the service's workers)
  invoke    min(c, W) threads each invoking its own interpreter on a ready tensor
and prints throughput, latency percentiles, errors, and the ratios between them:
service / invoke is the headline ratio; service / pipeline isolates what HTTP costs,
since image work (decode, resize) is real work the invoke baseline does not do.
The load generator runs on the same cores as the service: on 2 cores it takes a share.

Example usage:
    python bench/load.py                         # starts the service itself (cpu backend)
    python bench/load.py --concurrency 1,4 --duration 5 --backend emulated
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_service, default_photo, repo_root  # noqa: E402
from bench.stats import percentile_or_none  # noqa: E402

DEFAULT_CONCURRENCY = "1,2,4,8"
DEFAULT_DURATION_S = 8.0
DEFAULT_ROUNDS = 4
WARMUP_S = 1.0
MODEL = "efficientnet_lite0"
MAX_PIXELS = 50_000_000


# ---- service: raw HTTP/1.1 over asyncio streams (a light client: the cores are shared) ----

async def _one_connection(host, port, request: bytes, stop_at: float, warm_at: float, latencies, errors):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while (start := time.perf_counter()) < stop_at:
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            elapsed = time.perf_counter() - start
            if start >= warm_at:
                if status_line.split()[1:2] == [b"200"]:
                    latencies.append(elapsed)
                else:
                    errors.append(status_line.decode().strip())
    finally:
        writer.close()


def measure_service(url: str, photo: bytes, backend: str, concurrency: int, duration_s: float):
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /v1/models/{MODEL}/classify?top_k=1&backend={backend} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: image/jpeg\r\nContent-Length: {len(photo)}\r\n\r\n").encode()
    request = head + photo
    latencies, errors = [], []

    async def run():
        now = time.perf_counter()
        warm_at, stop_at = now + WARMUP_S, now + WARMUP_S + duration_s
        await asyncio.gather(*(_one_connection(host, int(port), request, stop_at, warm_at, latencies, errors)
                               for _ in range(concurrency)))

    asyncio.run(run())
    return latencies, len(errors)


# ---- the same work without HTTP ----

def _threads(count: int, work, duration_s: float) -> list[float]:
    """count threads calling work() until time is up; latencies after the warm-up."""
    latencies, lock = [], threading.Lock()
    start = time.perf_counter()
    warm_at, stop_at = start + WARMUP_S, start + WARMUP_S + duration_s

    def loop():
        mine = []
        while (t0 := time.perf_counter()) < stop_at:
            work()
            if t0 >= warm_at:
                mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


class Engines:
    """W engines of the backend, handed out one per invoke, as the service's pool does."""

    def __init__(self, backend: str, workers: int):
        from app.engines import ENGINES, EngineOptions
        from app.imaging.quantization import InputQuantizer
        from app.model_dir.reading import read_model_dir

        self.model_dir = read_model_dir(repo_root() / "models" / MODEL)
        engine_cls = ENGINES[backend]
        path = self.model_dir.file(engine_cls.model_file)
        self.idle: queue.Queue = queue.Queue()
        for _ in range(workers):
            engine = engine_cls.load(path, EngineOptions(cpu_threads=1))
            self.idle.put(engine)
        spec = engine.inputs[0]
        self.quantizer = InputQuantizer(self.model_dir.manifest.input, spec.dtype, spec.scale, spec.zero_point)

    def invoke(self, tensor: np.ndarray) -> None:
        engine = self.idle.get()
        try:
            engine.run([tensor])
        finally:
            self.idle.put(engine)


def measure_pipeline(interpreters: Engines, photo: bytes, concurrency: int, duration_s: float):
    from app.imaging import prepare

    spec = interpreters.model_dir.manifest.input

    def work():
        interpreters.invoke(interpreters.quantizer(prepare(photo, spec, MAX_PIXELS)))

    return _threads(concurrency, work, duration_s), 0


def measure_invoke(interpreters: Engines, tensor: np.ndarray, threads: int, duration_s: float):
    return _threads(threads, lambda: interpreters.invoke(tensor), duration_s), 0


def interleaved(measurements: dict, rounds: int, duration_s: float) -> dict:
    """Each measurement (name -> f(seconds) -> (latencies, errors)) in `rounds` alternating turns of
    duration_s / rounds, so drift on a noisy machine falls on all of them alike; summaries per name."""
    latencies = {name: [] for name in measurements}
    errors = dict.fromkeys(measurements, 0)
    for _ in range(rounds):
        for name, measure in measurements.items():
            got, failed = measure(duration_s / rounds)
            latencies[name] += got
            errors[name] += failed
    return {name: _summary(latencies[name], duration_s, errors[name]) for name in measurements}


def _summary(latencies: list[float], duration_s: float, errors: int = 0) -> dict:
    ms = np.asarray(latencies) * 1000
    return {
        "requests": len(ms),
        "rps": len(ms) / duration_s,
        "p50": percentile_or_none(ms, 50),
        "p99": percentile_or_none(ms, 99),
        "errors": errors,
    }


def print_table(rows: list[dict], workers: int, backend: str, photo_name: str) -> None:
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; "
          f"backend {backend}, {workers} interpreters, 1 thread each; photo {photo_name}")
    header = ("conc", "svc req/s", "svc p50", "svc p99", "errors", "pipe req/s", "pipe p50", "invoke req/s",
              "invoke p50", "svc/invoke", "svc/pipe", "svc-invoke p50", "svc-pipe p50")
    print("  ".join(f"{h:>12}" for h in header))
    for r in rows:
        s, p, i = r["service"], r["pipeline"], r["invoke"]
        cells = (r["concurrency"], f"{s['rps']:.1f}", f"{s['p50']:.2f}", f"{s['p99']:.2f}", s["errors"],
                 f"{p['rps']:.1f}", f"{p['p50']:.2f}", f"{i['rps']:.1f}", f"{i['p50']:.2f}",
                 f"{s['rps'] / i['rps']:.0%}", f"{s['rps'] / p['rps']:.0%}",
                 f"{s['p50'] - i['p50']:+.2f}", f"{s['p50'] - p['p50']:+.2f}")
        print("  ".join(f"{c:>12}" for c in cells))
    print("latencies in ms (medians and 99th percentiles over the run); svc-invoke p50 = the service's overhead")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help=f"levels (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"alternating turns per level the duration is split into (default {DEFAULT_ROUNDS})")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="interpreters (service and baseline)")
    parser.add_argument("--backend", default="cpu", help="service backend to load and use (cpu, emulated, ...)")
    parser.add_argument("--photo", type=Path, default=None, help="JPEG to send (default: scikit-learn's china.jpg)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    photo_path = args.photo or default_photo()
    photo = photo_path.read_bytes()
    levels = [int(c) for c in args.concurrency.split(",")]

    from app.imaging import prepare
    from app.imaging.decoding import reuse_image_buffers

    reuse_image_buffers()  # as the service does at start, so the pipeline baseline is as fast
    interpreters = Engines(args.backend, args.workers)
    tensor = interpreters.quantizer(prepare(photo, interpreters.model_dir.manifest.input, MAX_PIXELS))
    rows = []
    with bench_service(workers=args.workers, backends=args.backend) as service:
        for c in levels:
            rows.append({"concurrency": c} | interleaved({
                "service": lambda s, c=c: measure_service(service.url, photo, args.backend, c, s),
                "pipeline": lambda s, c=c: measure_pipeline(interpreters, photo, c, s),
                "invoke": lambda s, c=c: measure_invoke(interpreters, tensor, min(c, args.workers), s),
            }, args.rounds, args.duration))
    if args.json:
        print(json.dumps({"workers": args.workers, "backend": args.backend, "rows": rows}, indent=2))
    else:
        print_table(rows, args.workers, args.backend, photo_path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
