"""Event-loop CPU per request on the inference routes, for admitted requests (200) and refusals (503).

Under overload the event loop answers every refusal itself, so what one 503 costs it sets how fast
503s come back; for admitted requests it is the framework's share of a request's CPU. Measured
in-process: each request is driven straight into the ASGI app (a fake scope, receive and send, no
socket, no HTTP parser), and the loop thread's CPU clock (time.thread_time) is read around a block
of requests; image work and the invoke run on other threads and are not counted. Logging is set up
as the service sets it (INFO), written to /dev/null. 503s: the pool's
only interpreter is held, with no waiting room, so every request is refused at admission. The
harness row is the same loop around an ASGI app that answers at once: the part of each figure that
is the benchmark's own.

`--against DIR` measures another checkout (e.g. the main branch) in the same run: each checkout in
its own subprocess, rounds alternating between them, medians side by side with their ratio.

`--http` measures refusals over real HTTP instead: the service (bench/device_launcher.py, one simulated
device of 60 s, no waiting room) with its only place held by one request, `wrk` POSTing the 224x224
JPEG to /v1 classify for 2 s per concurrency; the figure is the whole server process's CPU (every
thread, /proc schedstat) per 503, beside wrk's rate and latencies.

Example usage:
    python bench/loop_cost.py                       # this checkout, medians of 5 rounds
    python bench/loop_cost.py --against /work/main  # before/after side by side
    python bench/loop_cost.py --profile "v1 classify 503"   # where one scenario's time goes
    python bench/loop_cost.py --http --against /work/main   # 503s over HTTP, server CPU per request
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "efficientnet_lite0"
SCENARIOS = ("v1 classify 200", "v1 classify 503", "v2 infer 200", "v2 infer 503")


# ---- one checkout, in this process ---------------------------------------------------------

def _photo_224() -> bytes:
    """scikit-learn's china.jpg cut to a 224x224 JPEG (the model's input size)."""
    from importlib import metadata

    from PIL import Image

    china = Path(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))
    image = Image.open(china).convert("RGB")
    side = min(image.size)
    square = image.crop((0, 0, side, side)).resize((224, 224), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    square.save(out, "JPEG", quality=90)
    return out.getvalue()


class Requests:
    """The requests of each scenario: method, path, query, headers, body."""

    def __init__(self, root: Path, jpeg: bytes):
        from app.imaging import prepare
        from app.model_dir.reading import read_model_dir

        spec = read_model_dir(root / "models" / MODEL).manifest.input
        tensor = prepare(jpeg, spec, 50_000_000)[None, ...]
        header = json.dumps({"inputs": [{"name": "image", "shape": list(tensor.shape), "datatype": "UINT8",
                                         "parameters": {"binary_data_size": tensor.nbytes}}],
                             "outputs": [{"name": "scores", "parameters": {"classification": 5}}]}).encode()
        self.v1 = (f"/v1/models/{MODEL}/classify", b"top_k=5", [(b"content-type", b"image/jpeg")], jpeg)
        self.v2 = (f"/v2/models/{MODEL}/infer", b"",
                   [(b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", str(len(header)).encode())], header + tensor.tobytes())

    def of(self, scenario: str):
        return self.v1 if scenario.startswith("v1") else self.v2


async def request(app, path: str, query: bytes, headers: list, body: bytes) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8000"), *headers, (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # the client stays connected: never a disconnect

    status = 0

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _answer_at_once(scope, receive, send):
    await send({"type": "http.response.start", "status": 503, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def loop_ms(app, req, n: int, expect: int) -> float:
    """Event-loop CPU per request, ms, over n requests."""
    start = time.thread_time()
    for _ in range(n):
        status = await request(app, *req)
        if status != expect:
            raise RuntimeError(f"expected {expect}, got {status}")
    return (time.thread_time() - start) / n * 1000


def registry_of(app):
    """The app's registry: through the Service it is a door of (app/api/deps.py), or, on a checkout from before the
    Service, its state."""
    try:
        from app.api.deps import service_of
    except ImportError:
        return app.state.registry
    return service_of(app).registry


def build_app(root: Path):
    from app.main import create_app
    from app.settings import Settings

    # Admission by count only (MAX_QUEUE_MS 0): the 503s are refusals for want of room, and the admitted requests,
    # one at a time after them, are never refused by time while the pool counts as overloaded (on a loaded machine
    # an invoke can outlast MAX_QUEUE_MS, and the 200 scenarios then got 503s).
    settings = Settings(model_dir=root / "models", models=[MODEL], default_model=MODEL, backends=["cpu"], workers=1,
                        max_waiting=0, max_queue_ms=0, warmup_at_start=False)
    return create_app(settings)


async def ready(app, timeout_s: float = 120.0) -> None:
    """Wait for the lifespan's background load."""
    deadline = time.monotonic() + timeout_s
    while not registry_of(app).ready():
        if time.monotonic() > deadline:
            raise RuntimeError("the model did not load")
        await asyncio.sleep(0.05)


def log_as_the_service_does() -> None:
    """app/__main__.py's logging (INFO, one formatted line per record), written to /dev/null: what
    the service logs per request is part of what a request costs the loop."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=open(os.devnull, "w"), force=True)


async def measure(root: Path, rounds: int, n: int, only: list[str]) -> dict[str, list[float]]:
    log_as_the_service_does()
    app = build_app(root)
    requests = Requests(root, _photo_224())
    figures: dict[str, list[float]] = {s: [] for s in only}
    figures["harness"] = []
    async with app.router.lifespan_context(app):
        await ready(app)
        pool = registry_of(app).get(MODEL).pool("cpu")
        for _ in range(rounds):
            figures["harness"].append(await loop_ms(_answer_at_once, requests.v1, n, 503))
            for scenario in only:
                refused = scenario.endswith("503")
                place = pool.admit() if refused else None  # the only interpreter's place, held
                try:
                    req = requests.of(scenario)
                    count = n if refused else max(50, n // 10)  # an admitted request waits for a real invoke
                    await loop_ms(app, req, 20, int(scenario[-3:]))  # warm
                    figures[scenario].append(await loop_ms(app, req, count, int(scenario[-3:])))
                finally:
                    if place is not None:
                        place.release()
    return figures


async def profile(root: Path, scenario: str, n: int, lines: int, sort: str = "cumulative") -> None:
    import cProfile
    import pstats

    log_as_the_service_does()
    app = build_app(root)
    req = Requests(root, _photo_224()).of(scenario)
    async with app.router.lifespan_context(app):
        await ready(app)
        place = registry_of(app).get(MODEL).pool("cpu").admit() if scenario.endswith("503") else None
        await loop_ms(app, req, 50, int(scenario[-3:]))
        profiler = cProfile.Profile()
        profiler.enable()
        await loop_ms(app, req, n, int(scenario[-3:]))
        profiler.disable()
        if place is not None:
            place.release()
    pstats.Stats(profiler).sort_stats(sort).print_stats(lines)


# ---- over HTTP ----------------------------------------------------------------------------

HTTP_CONCURRENCY = (1, 8, 64)


def _process_cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            pass  # a thread that just ended
    return total


def http_refusals(root: Path, seconds: float) -> dict[str, list[float]]:
    """Per concurrency: [server CPU ms per 503, 503s per second, p50 ms, p99 ms]."""
    import tempfile
    import threading
    import urllib.request

    from bench.device_capacity import LAUNCHER, Input, wrk_run
    from bench.service import ServiceProcess

    work = Path(tempfile.mkdtemp(prefix="loop_cost_"))
    env = {"PYTHONPATH": str(root), "EDGETPU_SERVE_BACKENDS": "simtpu", "EDGETPU_SERVE_MODELS": MODEL,
           "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_MAX_WAITING": "0", "EDGETPU_SERVE_WAIT_TIMEOUT_S": "100",
           "EDGETPU_SERVE_LOG_LEVEL": "warning", "BENCH_DEVICE_MS": "60000", "BENCH_DEVICES": "1",
           "BENCH_STATS_FILE": str(work / "stats.json"), "BENCH_STAGES": "0"}
    jpeg = _photo_224()
    figures: dict[str, list[float]] = {}
    service = ServiceProcess(env, inherit_settings=False, argv=[sys.executable, str(LAUNCHER)], cwd=root)
    try:
        service.wait_ready()

        def hold():  # the only place, for the device's 60 s; ends with an error when the service stops
            try:
                urllib.request.urlopen(urllib.request.Request(f"{service.url}/v1/classify", data=jpeg,
                                                              headers={"content-type": "image/jpeg"}), timeout=90)
            except OSError:
                pass

        threading.Thread(target=hold, daemon=True).start()
        time.sleep(0.5)
        item = Input("224x224 JPEG", jpeg, "image/jpeg")
        for concurrency in HTTP_CONCURRENCY:
            before = _process_cpu_ns(service.process.pid)
            run = wrk_run(service.url, item, concurrency, seconds, work)
            cpu_ms = (_process_cpu_ns(service.process.pid) - before) / 1e6
            if run["requests"] or run["errors"]:  # served (2xx) or failed: all must be refused
                raise RuntimeError(f"{run['requests']} requests were served, {run['errors']} failed, not refused")
            figures[f"c={concurrency}"] = [cpu_ms / run["shed"], run["shed_s"], run["p50_ms"], run["p99_ms"]]
    finally:
        service.stop()
    return figures


def _print_http(figures: dict[str, dict[str, list[list[float]]]]) -> None:
    from bench.stats import median

    labels = list(figures)
    print("503s over HTTP (wrk, 2 s per level): server CPU ms per request (every thread), medians of rounds")
    print(f"{'concurrency':<12}" + "".join(f"{label + ' CPU ms':>16}{'503/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
                                           for label in labels) + ("  CPU ratio" if len(labels) == 2 else ""))
    for level in next(iter(figures.values())):
        cells, cpu = "", []
        for label in labels:
            rounds = figures[label][level]
            med = [median(r[i] for r in rounds) for i in range(4)]
            cpu.append(med[0])
            cells += f"{med[0]:>16.3f}{med[1]:>8.0f}{med[2]:>8.2f}{med[3]:>8.1f}"
        print(f"{level:<12}{cells}" + (f"{cpu[1] / cpu[0]:>11.2f}" if len(cpu) == 2 else ""))


# ---- side by side --------------------------------------------------------------------------

def _run_worker(root: Path, rounds: int, n: int, only: list[str]) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, __file__, "--worker", str(root), "--rounds", str(rounds), "-n", str(n),
                          "--only", ",".join(only)], env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"worker for {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout to measure side by side (the 'before')")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per checkout; medians are reported")
    parser.add_argument("-n", type=int, default=2000, help="503s per round (admitted requests: a tenth of it)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--profile", metavar="SCENARIO", help="cProfile one scenario of this checkout instead")
    parser.add_argument("--sort", default="cumulative",
                        help="the profile's order (pstats keys: cumulative, tottime, ...)")
    parser.add_argument("--http", action="store_true", help="503s over real HTTP (wrk) instead, server CPU per request")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]

    if args.worker is not None:
        figures = asyncio.run(measure(args.worker, args.rounds, args.n, only))
        print(json.dumps(figures))
        return
    sys.path.insert(0, str(ROOT))  # not before: a worker measures the checkout its PYTHONPATH names
    if args.profile:
        asyncio.run(profile(ROOT, args.profile, args.n, 40, args.sort))
        return

    checkouts = {"this": ROOT} if args.against is None else {"before": args.against.resolve(), "after": ROOT}
    if args.http:
        by_checkout: dict[str, dict[str, list[list[float]]]] = {label: {} for label in checkouts}
        for _ in range(args.rounds):
            for label, root in checkouts.items():
                for level, values in http_refusals(root, 2.0).items():
                    by_checkout[label].setdefault(level, []).append(values)
        print(json.dumps(by_checkout)) if args.json else _print_http(by_checkout)
        return
    from bench.stats import median

    figures: dict[str, dict[str, list[float]]] = {label: {} for label in checkouts}
    for _ in range(args.rounds):  # alternating, one round each, so drift hits both alike
        for label, root in checkouts.items():
            for scenario, values in _run_worker(root, 1, args.n, only).items():
                figures[label].setdefault(scenario, []).extend(values)
    medians = {label: {s: median(v) for s, v in f.items()} for label, f in figures.items()}
    if args.json:
        print(json.dumps({"medians_ms": medians, "rounds": figures}, indent=1))
        return
    labels = list(checkouts)
    print(f"event-loop CPU per request, ms (median of {args.rounds} rounds; in-process ASGI, {MODEL}, cpu)")
    ratio_title = "     ratio" if len(labels) == 2 else ""
    print(f"{'scenario':<18}" + "".join(f"{label:>10}" for label in labels) + ratio_title)
    for scenario in [*only, "harness"]:
        row = [medians[label][scenario] for label in labels]
        ratio = f"{row[1] / row[0]:>10.2f}" if len(row) == 2 else ""
        print(f"{scenario:<18}" + "".join(f"{v:>10.3f}" for v in row) + ratio)
    for label, root in checkouts.items():
        print(f"{label}: {root}")


if __name__ == "__main__":
    main()
