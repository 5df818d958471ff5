"""perf_analyzer (Triton's load generator) against /v2, beside the native API, in one run.

For each concurrency level, in turn (so drift on a noisy machine falls on every column alike):
  perf_analyzer   Triton's own tool on POST /v2/models/M/infer: the photo as the model's input
                  tensor (UINT8 [1,224,224,3], binary), no image work on the server
  v2 tensor       the same request from this script's light asyncio client (tells the two clients apart)
  v2 jpeg         the photo as a BYTES image on /v2: decoded and preprocessed by the service
  v1 jpeg         the native API, POST /v1/models/M/classify with the same JPEG
The last three run in alternating rounds after perf_analyzer, for twice its window in all.
v2 jpeg vs v1 jpeg is what the protocol costs; v2 tensor vs v2 jpeg is what image work costs.

perf_analyzer is the binary bundled in tritonclient[http]==2.51.0 (the only one that runs on this
Debian). It runs from a venv of its own (.cache/venvs/perf_analyzer, made on first use: ~1 min,
~200 MB; it pins numpy 1.26) with nvidia-cuda-runtime-cu12 on LD_LIBRARY_PATH, and needs
`apt-get install libb64-0d`.

Example usage:
    python bench/perf_analyzer.py                          # starts the service itself (cpu backend)
    python bench/perf_analyzer.py --concurrency 1:8 --interval 3000 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.client_venv import ensure_venv  # noqa: E402
from bench.common import bench_service, default_photo  # noqa: E402
from bench.load import _one_connection, interleaved  # noqa: E402

MODEL = "efficientnet_lite0"
PERF_ANALYZER_REQUIREMENTS = ["tritonclient[http]==2.51.0", "nvidia-cuda-runtime-cu12==12.9.79"]
DEFAULT_CONCURRENCY = "1:8"
DEFAULT_INTERVAL_MS = 3000
MAX_PIXELS = 50_000_000
WARMUP_S = 0.3
# perf_analyzer's stability criterion; its default (10%) is rarely met on a shared 2-core machine
STABILITY_PERCENT = 25
MAX_TRIALS = 8
ROUNDS = 3


def perf_analyzer_command(python: Path) -> tuple[list[str], dict[str, str]]:
    venv = python.parent.parent
    lib = next(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":")}
    return [str(venv / "bin" / "perf_analyzer")], env


def photo_tensor(photo: bytes):
    """The photo as EfficientNet-Lite0's input tensor, made exactly as the service makes it."""
    from app.imaging import prepare
    from app.model_dir.reading import read_model_dir
    from bench.common import repo_root

    spec = read_model_dir(repo_root() / "models" / MODEL).manifest.input
    return prepare(photo, spec, MAX_PIXELS)[None]


def run_perf_analyzer(command: list[str], env: dict, url: str, data_file: Path, concurrency: int,
                      interval_ms: int, stability: int = STABILITY_PERCENT) -> dict | None:
    """perf_analyzer's figures at one concurrency; None when it found no stable measurement
    (three windows within `stability` percent of each other) even with a doubled window."""
    for window_ms in (interval_ms, 2 * interval_ms):
        with tempfile.NamedTemporaryFile(suffix=".csv") as out:
            args = [*command, "-m", MODEL, "-u", url.removeprefix("http://"), "-i", "http",
                    "--input-data", str(data_file), "--shape", "image:1,224,224,3",
                    "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(window_ms),
                    "--stability-percentage", str(stability), "--max-trials", str(MAX_TRIALS),
                    "-f", out.name]
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode == 0:
                row = next(csv.DictReader(open(out.name)))
                return {"rps": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]) / 1000,
                        "p99": float(row["p99 latency"]) / 1000, "errors": 0}
            if "Failed to obtain stable measurement" not in done.stdout + done.stderr:
                raise RuntimeError(f"perf_analyzer failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            print(f"perf_analyzer: no stable measurement at concurrency {concurrency} with {window_ms} ms windows",
                  file=sys.stderr)
    return None


def http_request(host: str, path: str, content_type: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def v2_binary(name: str, datatype: str, shape: list[int], blob: bytes) -> tuple[bytes, str]:
    header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(blob)}}],
                         "outputs": [{"name": "scores", "parameters": {"classification": 1}}]}).encode()
    return header + blob, f"Inference-Header-Content-Length: {len(header)}\r\n"


def measure(url: str, request: bytes, concurrency: int, seconds: float) -> tuple[list[float], int]:
    """c keep-alive connections sending `request` as fast as answers come, after a short warm-up."""
    host, port = url.removeprefix("http://").split(":")
    latencies, errors = [], []

    async def run():
        now = time.perf_counter()
        await asyncio.gather(*(_one_connection(host, int(port), request, now + WARMUP_S + seconds, now + WARMUP_S,
                                               latencies, errors) for _ in range(concurrency)))

    asyncio.run(run())
    return latencies, len(errors)


def print_table(rows: list[dict], workers: int, backend: str, photo_name: str) -> None:
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; "
          f"backend {backend}, {workers} interpreters, 1 thread each; photo {photo_name}; model {MODEL}")
    columns = ("perf_analyzer", "v2 tensor", "v2 jpeg", "v1 jpeg")
    print("conc  " + "  ".join(f"{c + ' req/s':>18} {'p50':>7} {'p99':>7}" for c in columns)
          + f"  {'v2/v1 jpeg':>10}  {'errors':>6}")
    for r in rows:
        cells = "  ".join(f"{r[c]['rps']:>18.1f} {r[c]['p50']:>7.2f} {r[c]['p99']:>7.2f}" if r[c] else
                          f"{'unstable':>18} {'-':>7} {'-':>7}" for c in columns)
        errors = sum(r[c]["errors"] for c in columns if r[c])
        print(f"{r['concurrency']:>4}  {cells}  {r['v2 jpeg']['rps'] / r['v1 jpeg']['rps']:>10.0%}  {errors:>6}")
    print("req/s: answers per second; p50, p99: latency in ms. perf_analyzer's figures are its own "
          "(stable windows of --interval ms); the others are this script's client, in alternating rounds.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help="FIRST:LAST levels (default 1:8)")
    parser.add_argument("--interval", type=int, default=DEFAULT_INTERVAL_MS,
                        help="perf_analyzer's measurement window, ms; the other columns run for as long")
    parser.add_argument("--stability", type=int, default=STABILITY_PERCENT,
                        help=f"perf_analyzer's --stability-percentage (default {STABILITY_PERCENT})")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="interpreters in the service")
    parser.add_argument("--backend", default="cpu",
                        help="the backend the service is started on; every column uses the service's default "
                             "backend (perf_analyzer sends no request parameters); with --url, only a label")
    parser.add_argument("--photo", type=Path, default=None, help="a JPEG (default: scikit-learn's china.jpg)")
    parser.add_argument("--url", default=None, help="a running service instead of starting one")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON after the table")
    args = parser.parse_args()
    first, _, last = args.concurrency.partition(":")
    levels = range(int(first), int(last or first) + 1)

    photo_path = args.photo or default_photo()
    photo = photo_path.read_bytes()
    tensor = photo_tensor(photo)
    command, env = perf_analyzer_command(ensure_venv("perf_analyzer", PERF_ANALYZER_REQUIREMENTS))
    with tempfile.TemporaryDirectory() as tmp:
        data_file = Path(tmp) / "input.json"
        data_file.write_text(json.dumps({"data": [{"image": {"content": tensor.reshape(-1).tolist(),
                                                             "shape": list(tensor.shape)}}]}))
        service = None if args.url else bench_service(args.workers, args.backend)
        url = args.url or service.wait_ready().url
        try:
            host = url.removeprefix("http://")
            path = f"/v2/models/{MODEL}/infer"
            tensor_body, tensor_header = v2_binary("image", "UINT8", list(tensor.shape), tensor.tobytes())
            jpeg_body, jpeg_header = v2_binary("image", "BYTES", [1], struct.pack("<I", len(photo)) + photo)
            requests = {
                "v2 tensor": http_request(host, path, "application/octet-stream", tensor_body, tensor_header),
                "v2 jpeg": http_request(host, path, "application/octet-stream", jpeg_body, jpeg_header),
                "v1 jpeg": http_request(host, f"/v1/models/{MODEL}/classify?top_k=1", "image/jpeg", photo),
            }
            seconds = args.interval / 1000 * 2
            rows = []
            for c in levels:
                row = {"concurrency": c,
                       "perf_analyzer": run_perf_analyzer(command, env, url, data_file, c, args.interval,
                                                          args.stability)}
                # our three in alternating rounds, so the machine's drift falls on each alike
                row.update(interleaved({name: (lambda s, r=request: measure(url, r, c, s))
                                        for name, request in requests.items()}, ROUNDS, seconds))
                rows.append(row)
                print(f"concurrency {c}: {json.dumps(row)}", file=sys.stderr)
        finally:
            if service is not None:
                service.stop()
    print_table(rows, args.workers, args.backend, photo_path.name)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
