"""Does the service keep the accelerator busy? Device capacity over HTTP against the bound without it.

The accelerator is simulated (bench/simulated_device.py: one interpreter = one device taking
D ms per inference with the GIL released, returning the real model's output), plugged in
through the backend plug-in interface by bench/device_launcher.py, which then runs the app
as `python -m app` does. For each device time D and device count, one service; for each
input and concurrency c, `wrk` (C, event-driven, one thread: the load generator shares the
cores with the service, as on a board, and a Python client would take several times its CPU)
sends the same request over c keep-alive connections. Reported per row:
  req/s and device busy = req/s x D / devices, counting only 2xx answers; shed requests (503 from a
  full line: every answer >= 400) apart, never as served; p50/p99 (wrk, over every answer),
  server CPU ms per request (every thread of the service, from /proc/<pid>/task/*/schedstat),
  and, in the same run, the bound without HTTP: the same image work (app.imaging) on the
  service's number of image threads feeding the same simulated devices through a queue.
Then a stage pass (a service with BENCH_STAGES=1, concurrency 1): the server's CPU per
request by stage (HTTP/framework, body read, decode, resize, quantize, post-processing,
response serialization, device copies, thread hand-offs), from thread CPU clocks.

With --processes P, the service is P worker processes on the one port (EDGETPU_SERVE_PROCESSES: gunicorn,
app/processes), the devices split evenly, the load from one wrk on the one port; the server's CPU is
every thread of every process (not split by thread kind: only one process names its threads).

Inputs: china.jpg (640x427 JPEG), a 224x224 JPEG made from scikit-image's chelsea.png, and
the raw uint8 tensor through OIP v2's binary extension when the service has /v2 (the hook
`v2_binary_request`; a service without /v2, an older checkout say, gets no such row and says so).
With --model NAME of a detection model (the person detector, say): a 640x480 JPEG of two people
(OpenCV's basketball1.png, as a camera frame) to /v1/models/NAME/detect and, as DeepStack's clients
send it, as multipart `image` to /v1/vision/custom/NAME; the simulated device returns that photo's
outputs (BENCH_DEVICE_PHOTO), so the post-processing maps its real boxes.

Example usage:
    python bench/device_capacity.py                      # D=2.5,5 ms; 1 and 2 devices
    python bench/device_capacity.py --device-ms 2.5 --devices 1 --concurrency 1,4,8 --duration 2
    python bench/device_capacity.py --checkout /work/main --checkout .   # two checkouts side by side
                                       # (all services up at once, points in alternating rounds: --rounds, 3)
    python bench/device_capacity.py --variant '' --variant 'COMPUTE_NICE=0'   # two settings side by side
    python bench/device_capacity.py --processes 2 --devices 2 --device-ms 2.5   # 2 workers, one device each
    python bench/device_capacity.py --backend cpu --workers 1 --concurrency 1   # a real backend
    python bench/device_capacity.py --peer --concurrency 1,4 --inputs 224      # cpu: ours vs a naive peer
    python bench/device_capacity.py --url http://board:8000 --device-ms 2.6     # a running service
    python bench/device_capacity.py --model ssdlite_mobilenet_v2_person --device-ms 7 --devices 1  # detection
    python bench/device_capacity.py --zmq --device-ms 7 --devices 4 --concurrency 1,2,4,8   # Frigate's ZMQ door

Beside the tables, a PNG chart: device busy against concurrency, one line per input and one panel
per table, the bound without HTTP dashed (--chart PATH; default beside --json's file, else
build/bench/device_capacity.png; --chart '' for none; needs matplotlib, the dev extra).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import default_photo, load_average, repo_root  # noqa: E402
from bench.service import STOP_TIMEOUT_S, ServiceProcess, free_port  # noqa: E402
from bench.charts import CHART_DIR  # noqa: E402
from bench.stats import median, ratio  # noqa: E402

MODEL = "efficientnet_lite0"
MAX_PIXELS = 50_000_000
LAUNCHER = Path(__file__).resolve().parent / "device_launcher.py"
ZMQ_CAPACITY = Path(__file__).resolve().parent / "zmq_capacity.py"  # --zmq
DEFAULT_CONCURRENCY = "1,2,4,8,16"
WARMUP_S = 1.0
STAGE_ORDER = ("HTTP, framework, event loop", "body read", "response serialization", "post-processing",
               "decode", "resize", "quantize", "image thread hand-off", "device copies",
               "device thread hand-off", "other threads")

# wrk prints one JSON line at the end: what the table needs, latencies in microseconds.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "%(content_type)s"
%(extra_headers)s
local f = assert(io.open("%(body)s", "rb"))
wrk.body = f:read("*a")
f:close()
function done(summary, latency, requests)
  io.write(string.format('{"requests": %%d, "us": %%d, "p50": %%d, "p99": %%d, "status": %%d, "connect": %%d, "read": %%d, "write": %%d, "timeout": %%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
"""


# ---- inputs ------------------------------------------------------------------------------

@dataclass
class Input:
    name: str
    body: bytes
    content_type: str
    path: str = ""                      # URL path; the default model's classify by default
    headers: dict[str, str] = field(default_factory=dict)
    jpeg: bytes | None = None           # for the bound without HTTP


def jpeg_224() -> bytes:
    """A 224x224 JPEG from a real photo: scikit-image's chelsea.png, center square, quality 90."""
    from importlib import metadata

    from PIL import Image

    png = Path(metadata.distribution("scikit-image").locate_file("skimage/data/chelsea.png"))
    image = Image.open(png).convert("RGB")
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    square = image.crop((left, top, left + side, top + side)).resize((224, 224), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    square.save(out, "JPEG", quality=90)
    return out.getvalue()


def jpeg_inputs() -> list[Input]:
    china = default_photo().read_bytes()
    small = jpeg_224()
    return [Input("224x224 JPEG", small, "image/jpeg", jpeg=small),
            Input("640x427 JPEG", china, "image/jpeg", jpeg=china)]


def detection_inputs(model: str) -> list[Input]:
    """A 640x480 camera frame of two people (OpenCV's basketball1.png, grey, as an RGB JPEG of quality 90): to the
    native route, and as DeepStack's clients send it (multipart `image`, `min_confidence`)."""
    from PIL import Image

    from converter.photos import people_photos

    frame = next(p for p in people_photos() if p.name == "basketball1.png")
    out = io.BytesIO()
    Image.open(frame).convert("RGB").save(out, "JPEG", quality=90)
    jpeg = out.getvalue()
    native = Input("640x480 JPEG, /v1/detect", jpeg, "image/jpeg", path=f"/v1/models/{model}/detect", jpeg=jpeg)
    deepstack = as_multipart(Input("640x480 JPEG, DeepStack", jpeg, "image/jpeg", jpeg=jpeg),
                             f"/v1/vision/custom/{model}", {"min_confidence": "0.45"})
    return [native, deepstack]


def task_of(model: str) -> str:
    from app.model_dir.reading import read_model_dir

    return read_model_dir(repo_root() / "models" / model).manifest.task


def v2_binary_request(url: str, model: str, jpeg: bytes) -> Input | None:
    """HOOK for the raw-tensor row: the uint8 tensor through OIP v2's binary extension, if the
    service has /v2 (the protocols work adds it). None when it has not; then the row is left out."""
    if task_of(model) != "classification":  # the row ranks a classifier's scores
        return None
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{model}", timeout=2) as r:
            meta = json.loads(r.read())
    except (OSError, ValueError):
        return None
    from app.imaging import prepare
    from app.model_dir.reading import read_model_dir

    spec = read_model_dir(repo_root() / "models" / model).manifest.input
    tensor = prepare(jpeg, spec, MAX_PIXELS)[None, ...]
    name = meta["inputs"][0]["name"]
    header = json.dumps({"inputs": [{"name": name, "shape": list(tensor.shape), "datatype": "UINT8",
                                     "parameters": {"binary_data_size": tensor.nbytes}}],
                         "outputs": [{"name": meta["outputs"][0]["name"],
                                      "parameters": {"classification": 5}}]}).encode()
    return Input("raw uint8 tensor, /v2 binary", header + tensor.tobytes(), "application/octet-stream",
                 path=f"/v2/models/{model}/infer",
                 headers={"Inference-Header-Content-Length": str(len(header))})


# ---- the service -------------------------------------------------------------------------

class Service(ServiceProcess):
    """The app of one checkout with the simulated device (or a real backend), on a free port,
    started through the shared launcher running bench/device_launcher.py."""

    def __init__(self, checkout: Path, device_ms: float, devices: int, backend: str, image_threads: int | None,
                 stages: bool = False, workers: int | None = None, settings: dict[str, str] | None = None,
                 processes: int = 1):
        """`devices` in all; with `processes` > 1, that many worker processes on the one port (python -m
        app under gunicorn, EDGETPU_SERVE_PROCESSES), each with devices / processes simulated devices."""
        self.checkout = checkout
        self.processes = processes
        self.stats_file = Path(tempfile.mkstemp(prefix="device_capacity_", suffix=".json")[1])
        each = devices // processes
        env = {"PYTHONPATH": str(checkout),
               "EDGETPU_SERVE_BACKENDS": backend, "EDGETPU_SERVE_MODELS": MODEL,
               "EDGETPU_SERVE_WORKERS": str(workers or each), "EDGETPU_SERVE_LOG_LEVEL": "warning",
               # the line holds the highest concurrency: a 503 is shed, reported apart, never served
               "EDGETPU_SERVE_MAX_WAITING": "64",
               "BENCH_DEVICE_MS": str(device_ms), "BENCH_DEVICES": str(each),
               "BENCH_STATS_FILE": str(self.stats_file), "BENCH_STAGES": "1" if stages else "0"}
        if processes > 1:
            env["EDGETPU_SERVE_PROCESSES"] = str(processes)
        if image_threads:
            env["EDGETPU_SERVE_IMAGE_THREADS"] = str(image_threads)
        env.update({f"EDGETPU_SERVE_{name}": value for name, value in (settings or {}).items()})
        super().__init__(env, inherit_settings=False, argv=[sys.executable, str(LAUNCHER)], cwd=checkout)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> str:
        try:
            return super().stop(timeout_s)
        finally:
            self.stats_file.unlink(missing_ok=True)

    def stats(self) -> dict:
        """Thread names and stage sums, written by the launcher on SIGUSR1 (one process: under gunicorn
        the master takes SIGUSR1 for its logs, so several processes name no threads)."""
        if self.processes > 1:
            return {"threads": {}, "stages": {}}
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.stat().st_size else 0
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            st = self.stats_file.stat()
            if st.st_size and st.st_mtime_ns != before:
                try:
                    return json.loads(self.stats_file.read_text())
                except ValueError:
                    pass
            time.sleep(0.02)
        raise RuntimeError("the launcher did not write its stats")

def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Each live thread's CPU time so far (schedstat: ns on the CPU), of the process and of its children
    (the worker processes when gunicorn's master is `pid`); thread ids are unique across processes."""
    out = {}
    for process in [pid, *child_pids(pid)]:
        try:
            tasks = list(Path(f"/proc/{process}/task").iterdir())
        except OSError:  # exited meanwhile
            continue
        for task in tasks:
            try:
                out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError):
                pass
    return out


def child_pids(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


FLOOR = Path(__file__).resolve().parent / "floor_server.py"


class FloorServer(ServiceProcess):
    """bench/floor_server.py (everything on the event loop, nothing but the work) with the same
    simulated device: what concurrency 1 costs at the least on this machine and HTTP stack."""

    def __init__(self, device_ms: float):
        port = free_port()
        super().__init__({"PYTHONPATH": str(repo_root()), "FLOOR_PORT": str(port), "BENCH_DEVICE_MS": str(device_ms)},
                         argv=[sys.executable, str(FLOOR)], port=port, ready_path="/")

    def stats(self) -> dict:
        return {"threads": {str(self.process.pid): "event loop"}}


def thread_kind(name: str) -> str:
    if name == "event loop":
        return "event loop"
    if name.startswith("image"):
        return "image"
    if name.startswith(("pool", "engine", "interp", "simtpu")) or "simtpu" in name:
        return "device"
    return "other"


# ---- the load generator -------------------------------------------------------------------

def wrk_run(url: str, item: Input, concurrency: int, seconds: float, workdir: Path) -> dict:
    body = workdir / f"body_{abs(hash(item.name))}.bin"
    body.write_bytes(item.body)
    script = workdir / f"post_{abs(hash(item.name))}.lua"
    extra = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in item.headers.items())
    script.write_text(WRK_SCRIPT % {"content_type": item.content_type, "body": body, "extra_headers": extra})
    path = item.path or f"/v1/models/{MODEL}/classify?top_k=5"
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script),
                          url + path], capture_output=True, text=True, timeout=seconds + 30)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if not line:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    return wrk_figures(json.loads(line[-1]))


def wrk_figures(figures: dict) -> dict:
    """wrk's summary as the tables count it: only 2xx answers are served (req/s, and so device busy);
    answers >= 400 (wrk's status errors: 503s from a full line, in practice) are shed, counted apart;
    connect, read, write and timeout failures are errors. Latencies are wrk's, over every answer."""
    seconds = figures["us"] / 1e6
    served = figures["requests"] - figures["status"]
    return {"req_s": served / seconds, "p50_ms": figures["p50"] / 1000, "p99_ms": figures["p99"] / 1000,
            "requests": served, "shed": figures["status"], "shed_s": figures["status"] / seconds,
            "errors": sum(figures[k] for k in ("connect", "read", "write", "timeout"))}


# ---- the bound without HTTP ---------------------------------------------------------------

def bound_without_http(jpeg: bytes, device_ms: float, devices: int, image_threads: int, seconds: float) -> dict:
    """The same image work on `image_threads` threads feeding `devices` simulated devices through
    a bounded queue, post-processing on the device's thread; completions per second."""
    import bench.simulated_device as sim
    from app.imaging.decoding import decode_with_source
    from app.imaging.geometry import Geometry, to_pixels
    from app.imaging.quantization import InputQuantizer
    from app.model_dir.reading import read_model_dir

    model_dir = read_model_dir(repo_root() / "models" / MODEL)
    spec = model_dir.manifest.input
    inputs, outputs, values = _real_output(model_dir, jpeg)
    postprocess = postprocessing(model_dir, outputs)
    quantizer = InputQuantizer(spec, inputs[0].dtype, inputs[0].scale, inputs[0].zero_point)
    engines = [sim.SimulatedTpuEngine(inputs, outputs, values, device_ms / 1000) for _ in range(devices)]
    tensors: queue.Queue = queue.Queue(maxsize=devices)
    stop = threading.Event()
    counting = threading.Event()
    done = [0] * devices

    def image_work():
        while not stop.is_set():
            image, source = decode_with_source(jpeg, spec, MAX_PIXELS)
            tensor = quantizer(to_pixels(image, spec))
            geometry = Geometry.of(source, image.size, spec)
            while not stop.is_set():
                try:
                    tensors.put((tensor, geometry), timeout=0.05)
                    break
                except queue.Full:
                    pass

    def device(i: int):
        engine = engines[i]
        while not stop.is_set():
            try:
                tensor, geometry = tensors.get(timeout=0.05)
            except queue.Empty:
                continue
            postprocess(engine.run([tensor]), geometry)
            if counting.is_set():
                done[i] += 1

    threads = [threading.Thread(target=image_work, daemon=True) for _ in range(image_threads)]
    threads += [threading.Thread(target=device, args=(i,), daemon=True) for i in range(devices)]
    for t in threads:
        t.start()
    time.sleep(min(WARMUP_S, seconds / 2))
    counting.set()
    start = time.perf_counter()
    time.sleep(seconds)
    counting.clear()
    elapsed = time.perf_counter() - start
    stop.set()
    for t in threads:
        t.join(5)
    return {"req_s": sum(done) / elapsed}


def postprocessing(model_dir, outputs):
    """The task's work on one run's outputs, as the service does it: a classifier's top 5, a detector's objects
    (min score 0.45, DeepStack's default)."""
    from app.tasks import TASKS

    task = TASKS[model_dir.manifest.task]
    roles = task.bind(model_dir, outputs)
    if task.name == "detection":
        from app.tasks.detect import objects

        return lambda values, geometry: objects(roles, values, geometry, model_dir.labels, 0.45)
    from app.tasks.classify import scores, top_predictions

    spec = roles.specs["scores"]
    return lambda values, geometry: top_predictions(
        scores(roles.of(values, "scores"), spec.scale, spec.zero_point, model_dir), model_dir.labels, 5, 0.0)


_OUTPUTS: dict = {}


def _real_output(model_dir, jpeg: bytes | None = None):
    """The model's outputs for the photo the bound sends (a classifier's: the default photo's, as the service's)."""
    key = (model_dir.name, jpeg if model_dir.manifest.task != "classification" else None)
    if key not in _OUTPUTS:
        import bench.simulated_device as sim

        _OUTPUTS[key] = sim.real_output(model_dir.file("int8"), key[1])
    return _OUTPUTS[key]


# ---- measuring -----------------------------------------------------------------------------

def device_time_ms(url: str, item: Input, n: int = 20) -> float:
    """Median `inference` ms the service reports for this input, sequentially (a real backend's D)."""
    values = []
    for _ in range(n):
        request = urllib.request.Request(url + (item.path or f"/v1/models/{MODEL}/classify?top_k=5"),
                                         data=item.body, headers={"Content-Type": item.content_type, **item.headers})
        with urllib.request.urlopen(request, timeout=30) as r:
            body, json_size = r.read(), r.headers.get("Inference-Header-Content-Length")
        answer = json.loads(body[:int(json_size)] if json_size else body)
        # /v1 reports timing_ms; OIP v2 the same stages as parameters (ahead of binary outputs)
        values.append(answer["timing_ms"]["inference"] if "timing_ms" in answer
                      else answer["parameters"]["inference_ms"])
    return median(values)


def measure_service(service: Service | None, url: str, inputs: list[Input], levels: list[int], seconds: float,
                    device_ms: float | None, devices: int, workdir: Path) -> list[dict]:
    """One service alone: each input at each concurrency, once."""
    return measure_side_by_side([(service, url, inputs)], levels, seconds, device_ms, devices, workdir, 1)[0]


def measure_side_by_side(sides: list[tuple[Service | None, str, list[Input]]], levels: list[int], seconds: float,
                         device_ms: float | None, devices: int, workdir: Path, rounds: int) -> list[list[dict]]:
    """Several services up at once, measured point by point in alternating rounds, each figure the
    median over the rounds: one service after another was biased by whatever the machine did
    meanwhile (the same checkout measured twice in a row: 2.95 and 3.26 ms of CPU per request)."""
    names = [input_names(side_inputs) for _, _, side_inputs in sides]
    rows: list[list[dict]] = [[] for _ in sides]
    for name in dict.fromkeys(n for side_names in names for n in side_names):
        prepared = []
        for service, url, side_inputs in sides:
            item = next((i for i in side_inputs if i.name == name), None)
            if item is None:
                prepared.append(None)
                continue
            wrk_run(url, item, max(levels), WARMUP_S, workdir)  # warm: threads created, caches filled
            d_ms = device_ms if device_ms is not None else device_time_ms(url, item)
            threads = {int(k): v for k, v in service.stats()["threads"].items()} if service else {}
            prepared.append((item, d_ms, threads))
        for c in levels:
            points: list[list[dict]] = [[] for _ in sides]
            for _ in range(rounds):
                for i, (service, url, _) in enumerate(sides):
                    if prepared[i] is not None:
                        item, d_ms, threads = prepared[i]
                        points[i].append(measure_point(service, url, item, c, seconds, d_ms, devices, threads,
                                                       workdir))
            for i, side_points in enumerate(points):
                if side_points:
                    rows[i].append(median_point(side_points))
    return rows


def input_names(inputs: list[Input]) -> list[str]:
    return [item.name for item in inputs]


def measure_point(service: Service | None, url: str, item: Input, c: int, seconds: float, d_ms: float, devices: int,
                  threads: dict[int, str], workdir: Path) -> dict:
    before = thread_cpu_ns(service.process.pid) if service else {}
    figures = wrk_run(url, item, c, seconds, workdir)
    row = {"input": item.name, "concurrency": c, "device_ms": d_ms, "devices": devices, **figures,
           "device_busy": figures["req_s"] * d_ms / 1000 / devices}
    if service:
        after = thread_cpu_ns(service.process.pid)
        per_kind: dict[str, float] = {}
        for tid, ns in after.items():
            kind = thread_kind(threads.get(tid, ""))
            per_kind[kind] = per_kind.get(kind, 0) + (ns - before.get(tid, 0))
        n = max(1, figures["requests"])
        row["cpu_ms_per_request"] = {k: v / n / 1e6 for k, v in per_kind.items()}
        row["cpu_ms_per_request_total"] = sum(per_kind.values()) / n / 1e6
    return row


def median_point(points: list[dict]) -> dict:
    """Each figure's median over the rounds (errors: their sum); CPU by thread kind each its own median."""
    if len(points) == 1:
        return points[0]
    row = dict(points[0])
    for key in ("req_s", "p50_ms", "p99_ms", "device_busy", "cpu_ms_per_request_total"):
        if key in row:
            row[key] = median(p[key] for p in points)
    for key in ("requests", "shed", "errors"):
        row[key] = sum(p.get(key, 0) for p in points)
    if "cpu_ms_per_request" in row:
        kinds = {k for p in points for k in p["cpu_ms_per_request"]}
        row["cpu_ms_per_request"] = {k: median(p["cpu_ms_per_request"].get(k, 0.0) for p in points)
                                     for k in kinds}
    row["rounds"] = len(points)
    return row


def stage_pass(service: Service, item: Input, seconds: float, workdir: Path) -> dict:
    """CPU ms per request by stage at concurrency 1 (the service wraps its stage functions)."""
    wrk_run(service.url, item, 1, WARMUP_S, workdir)
    first = service.stats()
    names = {int(k): v for k, v in first["threads"].items()}
    before = thread_cpu_ns(service.process.pid)
    figures = wrk_run(service.url, item, 1, seconds, workdir)
    after = thread_cpu_ns(service.process.pid)
    last = service.stats()
    n = max(1, figures["requests"])
    stage = {k: (v[0] - first["stages"].get(k, [0, 0])[0]) / n / 1e6 for k, v in last["stages"].items()}
    kinds: dict[str, float] = {}
    for tid, ns in after.items():
        kind = thread_kind(names.get(tid, ""))
        kinds[kind] = kinds.get(kind, 0) + (ns - before.get(tid, 0)) / n / 1e6
    loop_known = sum(stage.get(s, 0) for s in ("body read", "response serialization", "post-processing"))
    image_known = sum(stage.get(s, 0) for s in ("decode", "resize", "quantize"))
    out = {s: stage.get(s, 0.0) for s in ("body read", "response serialization", "post-processing",
                                           "decode", "resize", "quantize", "device copies")}
    out["HTTP, framework, event loop"] = kinds.get("event loop", 0) - loop_known
    if kinds.get("image", 0):
        out["image thread hand-off"] = kinds.get("image", 0) - image_known
    else:  # image work on the loop (no image threads): it is counted inside the loop's figure
        out["HTTP, framework, event loop"] -= image_known
    out["device thread hand-off"] = kinds.get("device", 0) - stage.get("device copies", 0)
    out["other threads"] = kinds.get("other", 0)
    return {"input": item.name, "requests": figures["requests"], "req_s": figures["req_s"],
            "p50_ms": figures["p50_ms"], "stages_ms": out, "total_ms": sum(kinds.values())}


# ---- the naive peer (cpu backend) ------------------------------------------------------------

PEER = Path(__file__).resolve().parent / "naive_peer.py"
BOUNDARY = "capacity-bench-boundary"
PEER_ROUNDS = 3


def as_multipart(item: Input, path: str, fields: dict[str, str] | None = None) -> Input:
    """The same photo as multipart field `image` (the only form the peer takes), after text `fields`."""
    texts = "".join(f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
                    for name, value in (fields or {}).items())
    body = (f"{texts}--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"photo.jpg\"\r\n"
            "Content-Type: image/jpeg\r\n\r\n").encode() + item.body + f"\r\n--{BOUNDARY}--\r\n".encode()
    return Input(item.name + ", multipart", body, f"multipart/form-data; boundary={BOUNDARY}", path=path,
                 jpeg=item.jpeg)


def peer_service(preprocess: str = "naive") -> ServiceProcess:
    """bench/naive_peer.py on a free port, with the default model's int8 file (ready on entry);
    preprocess "exact": with our own preprocessing instead of its stretch."""
    port = free_port()
    model = repo_root() / "models" / MODEL / f"{MODEL}_int8.tflite"
    return ServiceProcess({"PEER_MODEL": str(model), "PEER_PORT": str(port), "PEER_PREPROCESS": preprocess,
                           "PYTHONPATH": str(repo_root())}, argv=[sys.executable, str(PEER)],
                          port=port, ready_path="/openapi.json")


def peer_comparison(inputs: list[Input], levels: list[int], seconds: float, workers: int, workdir: Path) -> list[dict]:
    """Ours (cpu backend, `workers` interpreters of 1 thread), the naive peer, and the peer with our
    preprocessing, in alternating rounds, the same multipart request; medians over the rounds."""
    rows = []
    with (Service(repo_root(), 0, 1, "cpu", None, workers=workers) as ours, peer_service() as peer,
          peer_service("exact") as fair_peer):
        for item in inputs:
            sides = {"ours": (ours.url, as_multipart(item, f"/v1/models/{MODEL}/classify?top_k=1")),
                     "naive peer": (peer.url, as_multipart(item, "/v1/vision/scene")),
                     "peer, our preprocessing": (fair_peer.url, as_multipart(item, "/v1/vision/scene"))}
            for url, request in sides.values():
                wrk_run(url, request, 1, WARMUP_S, workdir)
            for c in levels:
                got: dict[str, list[dict]] = {side: [] for side in sides}
                for _ in range(PEER_ROUNDS):
                    for side, (url, request) in sides.items():
                        got[side].append(wrk_run(url, request, c, seconds, workdir))
                row = {"input": item.name, "concurrency": c, "workers": workers}
                for side, runs in got.items():
                    row[side] = {k: median(r[k] for r in runs) for k in ("req_s", "p50_ms", "p99_ms")}
                    row[side]["errors"] = sum(r["errors"] + r["shed"] for r in runs)
                rows.append(row)
    return rows


def print_peer(rows: list[dict]) -> None:
    print(f"\n### cpu backend, ours (WORKERS={rows[0]['workers']}, 1 thread) against the naive peer, multipart, "
          f"medians of {PEER_ROUNDS} alternating rounds (load average {load_average()})\n")
    print("(peer, our preprocessing: the same script with the center crop scaled to the model's input, the "
          "tensor ours hands its interpreter, instead of the stretch)\n")
    print("| input | c | ours req/s (p50 ms) | peer req/s (p50 ms) | ours p50 / peer p50 "
          "| peer, our preprocessing: req/s (p50 ms) | ours p50 / its p50 | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, p, f = r["ours"], r["naive peer"], r["peer, our preprocessing"]
        print(f"| {r['input']} | {r['concurrency']} | {o['req_s']:.1f} ({o['p50_ms']:.2f}) | {p['req_s']:.1f} "
              f"({p['p50_ms']:.2f}) | {ratio(o['p50_ms'], p['p50_ms']):.2f}x | {f['req_s']:.1f} ({f['p50_ms']:.2f}) | "
              f"{ratio(o['p50_ms'], f['p50_ms']):.2f}x | {o['errors'] + p['errors'] + f['errors']} |")


# ---- report --------------------------------------------------------------------------------

def print_rows(title: str, rows: list[dict], bounds: dict) -> None:
    print(f"\n### {title}\n")
    print("| input | c | req/s (2xx) | p50 ms | p99 ms | device busy | shed (503) | without HTTP req/s (busy) "
          "| service / bound | server CPU ms/req (loop + image + device + other) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bound = bounds.get(r["input"])
        bound_txt = "-" if bound is None else f"{bound:.0f} ({bound * r['device_ms'] / 1000 / r['devices']:.0%})"
        share = ratio(r["req_s"], bound)
        share_txt = "-" if share is None else f"{share:.0%}"
        cpu = r.get("cpu_ms_per_request")
        if cpu is None:
            cpu_txt = "-"
        elif set(cpu) <= {"other"}:  # several processes: their threads are not named (Service.stats)
            cpu_txt = f"{r['cpu_ms_per_request_total']:.2f} (all processes)"
        else:
            cpu_txt = f"{r['cpu_ms_per_request_total']:.2f} (" + " + ".join(
                f"{cpu.get(k, 0):.2f}" for k in ("event loop", "image", "device", "other")) + ")"
        shed = r.get("shed", 0)
        print(f"| {r['input']} | {r['concurrency']} | {r['req_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['device_busy']:.0%} | {shed} | {bound_txt} | {share_txt} | {cpu_txt} | {r['errors']} |")


def chart_panels(report: dict) -> list[dict]:
    """The report's tables (points grouped by their "table" title, in order) as panels of the
    utilisation chart, each input's bound without HTTP as a device-busy fraction (req/s x D / devices).
    Works on a saved --json report too: a chart can be redrawn without measuring again."""
    tables: dict[str, list[dict]] = {}
    for point in report["points"]:
        tables.setdefault(point.get("table", point.get("run", "")), []).append(point)
    panels = []
    for title, points in tables.items():
        busy = {b["input"]: b["req_s"] * b["device_ms"] / 1000 / b["devices"] for b in report.get("bounds", [])
                for p in points[:1] if (b["device_ms"], b["devices"]) == (p["device_ms"], p["devices"])}
        panels.append({"title": title, "points": points, "bounds": busy})
    return panels


def write_chart(report: dict, path: Path, title: str) -> Path | None:
    """The report's tables as device-busy lines in a PNG at `path`; None (and why, on stderr) without
    matplotlib or without points."""
    from bench import charts

    if not charts.available():
        print("no chart: matplotlib is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return None
    if not report["points"]:
        return None
    return charts.utilisation_lines(chart_panels(report), path, title)


def print_estimated_row(model: str) -> None:
    """No Edge TPU here: the estimated Edge TPU row (converter/estimate.py) under the measured rows, labelled.

    Its req/s is what one device alone would allow (1000 / estimated invoke ms), without HTTP or image work.
    """
    from converter.estimate import EstimateError, estimate_row

    try:
        row = estimate_row(repo_root() / "models" / model)
    except EstimateError as e:
        print(f"\n(no estimated Edge TPU row: {e})")
        return
    print(f"| {row['backend']} | 1 | <= {row['device_req_s']:.0f} per device | {row['inference_ms']:.2f} (invoke "
          "alone) | - | - | - | - | - | - |")
    print(f"\nestimated Edge TPU: not measured, from the model's structure; {row['error']}")


def print_stages(title: str, results: list[dict]) -> None:
    print(f"\n### {title}\n")
    print("| stage | " + " | ".join(r["input"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for stage in STAGE_ORDER:
        print(f"| {stage} | " + " | ".join(f"{r['stages_ms'].get(stage, 0):.3f}" for r in results) + " |")
    print("| **total server CPU** | " + " | ".join(f"**{r['total_ms']:.3f}**" for r in results) + " |")
    print("| requests (c=1), p50 ms | " + " | ".join(f"{r['requests']}, {r['p50_ms']:.2f}" for r in results) + " |")


def variant_settings(text: str) -> dict[str, str]:
    """'MAX_QUEUE_MS=30 COMPUTE_NICE=5' -> {"MAX_QUEUE_MS": "30", "COMPUTE_NICE": "5"}."""
    pairs = [item.partition("=") for item in text.split()]
    if any(not sep or not name for name, sep, _ in pairs):
        raise SystemExit(f"--variant takes NAME=VALUE pairs, got {text!r}")
    return {name.upper().removeprefix("EDGETPU_SERVE_"): value for name, _, value in pairs}


def run_name(checkout: Path, settings: dict[str, str]) -> str:
    return f"{checkout} [{' '.join(f'{k}={v}' for k, v in settings.items())}]" if settings else str(checkout)


def short_run_name(name: str, sides: int) -> str:
    """A run's name for a chart panel: the floor as "floor", this checkout as "this checkout", and
    nothing at all when it ran alone (the chart's title says what was measured)."""
    if name.startswith("floor"):
        return "floor"
    if sides == 1:
        return "service"
    return name.replace(str(repo_root()), "this checkout")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device-ms", default="2.5,5", help="simulated device times, ms (comma-separated)")
    parser.add_argument("--devices", default="1,2", help="device counts (comma-separated)")
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help="connections (comma-separated)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measured point")
    parser.add_argument("--inputs", default="224,640", help="which inputs: 224, 640 (the v2 row joins when it can)")
    parser.add_argument("--model", default=MODEL, help="the model served (default %(default)s); a detection model "
                        "gets the detection inputs instead of --inputs: a 640x480 JPEG to /v1/detect and DeepStack's")
    parser.add_argument("--image-threads", type=int, default=None,
                        help="EDGETPU_SERVE_IMAGE_THREADS for the service and the bound (default: the service's)")
    parser.add_argument("--checkout", action="append", type=Path, default=None,
                        help="checkout(s) to serve from, side by side (default: this one); another checkout's "
                             "app runs with that checkout alone on PYTHONPATH")
    parser.add_argument("--variant", action="append", default=None, metavar="'NAME=VALUE ...'",
                        help="service settings (EDGETPU_SERVE_ prefix left out) to run side by side, each checkout "
                             "once per variant; '' = the defaults. E.g. --variant '' --variant 'COMPUTE_NICE=0'")
    parser.add_argument("--processes", default="1",
                        help="worker processes on the one port (comma-separated; EDGETPU_SERVE_PROCESSES, gunicorn), "
                             "the devices split evenly among them: --processes 2 --devices 4 gives each worker 2")
    parser.add_argument("--backend", default="simtpu", help="backend to serve on (simtpu: the simulated device)")
    parser.add_argument("--workers", type=int, default=None, help="EDGETPU_SERVE_WORKERS for a real backend")
    parser.add_argument("--url", default=None, help="measure a running service instead (no CPU figures)")
    parser.add_argument("--no-stages", action="store_true", help="skip the per-stage CPU pass")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds per point, medians reported (default: 3 when several checkouts, "
                             "variants or the floor run side by side, else 1)")
    parser.add_argument("--peer", action="store_true",
                        help="instead: the cpu backend (WORKERS=--workers, default 1) against bench/naive_peer.py")
    parser.add_argument("--floor", action="store_true",
                        help="also, side by side: bench/floor_server.py, the least a server on this HTTP stack does "
                             "per request (all on the event loop, one request at a time): the floor for c=1")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    parser.add_argument("--chart", type=Path, default=None,
                        help="write the device-busy chart (PNG) here (default: beside --json as .png, else "
                             "build/bench/device_capacity.png); '' for none")
    parser.add_argument("--zmq", action="store_true",
                        help="instead: Frigate's ZMQ door (bench/zmq_capacity.py): Frigate-like clients sending 320x320 "
                             "uint8 tensors, beside HTTP /v2 binary and a naive REP peer; --device-ms, --devices, "
                             "--concurrency (clients), --duration and --json apply")
    parser.add_argument("--redraw", type=Path, default=None, metavar="JSON",
                        help="measure nothing: draw the chart of a report saved with --json")
    return parser.parse_args(argv)


def chart_path(args: argparse.Namespace) -> Path:
    """--chart, else beside --json (or the --redraw report) as .png, else build/bench/device_capacity.png."""
    if args.chart is not None:
        return args.chart
    saved = args.json or args.redraw
    return saved.with_suffix(".png") if saved else CHART_DIR / "device_capacity.png"


def charted(report: dict, chart: Path, title: str) -> None:
    """The chart of `report` at `chart` (none when --chart ''), and where it went."""
    if str(chart) not in ("", ".") and (written := write_chart(report, chart, title)):
        print(f"\nchart: {written}")


@dataclass(frozen=True)
class Plan:
    """What one run measures, from the command line."""

    levels: list[int]                # connections
    simulated: bool                  # the simulated device (simtpu), on services this script starts
    device_times: list[float | None]  # D, ms: None for a real backend
    device_counts: list[int]
    process_counts: list[int]
    inputs: list                     # the JPEG inputs (jpeg_inputs())
    runs: list[tuple[Path, dict[str, str]]]  # (checkout, settings), side by side
    rounds: int
    image_threads: int
    detection: bool                  # a detection model: a camera frame, to its route and to DeepStack's

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        try:
            from app.core import image_threads as default_image_threads
        except ImportError:  # a checkout from before the core (app/core/)
            from app.inference import image_threads as default_image_threads

        simulated = args.backend == "simtpu" and args.url is None
        detection = task_of(MODEL) == "detection"
        runs = [(c.resolve(), variant_settings(v)) for c in (args.checkout or [repo_root()])
                for v in (args.variant or [""])]
        return cls(
            levels=[int(c) for c in args.concurrency.split(",")],
            simulated=simulated,
            device_times=[float(d) for d in args.device_ms.split(",")] if (simulated or args.url) else [None],
            device_counts=[int(n) for n in args.devices.split(",")] if simulated else [args.workers or 1],
            process_counts=[int(p) for p in args.processes.split(",")],
            inputs=(detection_inputs(MODEL) if detection else
                    [i for i in jpeg_inputs() if i.name.split("x")[0] in args.inputs.split(",")]),
            runs=runs,
            rounds=args.rounds or (3 if len(runs) > 1 or args.floor else 1),
            # the service's own default for a device backend (this checkout's rule), for the bound too
            image_threads=default_image_threads(args.image_threads, host_cpu=not simulated),
            detection=detection,
        )


def redraw(args: argparse.Namespace, chart: Path) -> int:
    """--redraw: the chart of a saved report, nothing measured."""
    report = json.loads(args.redraw.read_text())
    written = write_chart(report, chart, report.get("chart_title", "device busy against concurrency"))
    print(f"chart: {written}" if written else "no chart", file=sys.stdout if written else sys.stderr)
    return 0 if written else 1


def measure_peer(args: argparse.Namespace, plan: Plan, workdir: Path) -> int:
    """--peer: the cpu backend against bench/naive_peer.py."""
    rows = peer_comparison(plan.inputs, plan.levels, args.duration, args.workers or 1, workdir)
    print_peer(rows)
    if args.json:
        args.json.write_text(json.dumps({"peer": rows}, indent=2))
    return 1 if any(side["errors"] for r in rows for side in r.values() if isinstance(side, dict)) else 0


def measure_running(args: argparse.Namespace, plan: Plan, workdir: Path, chart: Path) -> int:
    """--url: a service already running, at each device time (no CPU figures)."""
    report: dict = {"points": [], "stages": [], "bounds": []}
    url = args.url.rstrip("/")
    v2 = v2_binary_request(url, MODEL, plan.inputs[0].jpeg)
    for d in plan.device_times:
        rows = measure_service(None, url, plan.inputs + ([v2] if v2 else []), plan.levels, args.duration, d,
                               args.devices and int(args.devices.split(",")[0]), workdir)
        print_rows(f"{url}, D = {d} ms (load average {load_average()})", rows, {})
        for r in rows:
            r["table"] = f"D = {d} ms"
        report["points"] += rows
    charted(report, chart, f"device busy, {url}")
    return 0


def bounds_without_http(args: argparse.Namespace, plan: Plan, d: float | None, n: int, report: dict) -> dict:
    """Each input's req/s with no HTTP in the way (the simulated device only), into the report too."""
    bounds = {}
    if plan.simulated:
        for item in plan.inputs:
            bounds[item.name] = bound_without_http(item.jpeg, d, n, plan.image_threads, args.duration)["req_s"]
            report["bounds"].append({"input": item.name, "device_ms": d, "devices": n, "req_s": bounds[item.name]})
    return bounds


def measure_sides(args: argparse.Namespace, plan: Plan, d: float | None, n: int, processes: int,
                  workdir: Path) -> tuple[list[str], list[tuple], list[list[dict]]]:
    """Every run (checkout x variant) served at once, and the floor server with one device if asked, measured
    side by side: their names, (server, url, inputs) and rows."""
    with contextlib.ExitStack() as stack:
        sides = []
        for checkout, settings in plan.runs:
            svc = stack.enter_context(Service(checkout, d or 0, n, args.backend, args.image_threads,
                                              workers=args.workers, settings=settings, processes=processes))
            v2 = v2_binary_request(svc.url, MODEL, plan.inputs[0].jpeg)
            sides.append((svc, svc.url, plan.inputs + ([v2] if v2 else [])))
        names = [run_name(checkout, settings) for checkout, settings in plan.runs]
        if args.floor and n == 1:
            floor = stack.enter_context(FloorServer(d))
            sides.append((floor, floor.url, plan.inputs))
            names.append("floor (bench/floor_server.py: all on the event loop, no limits)")
        return names, sides, measure_side_by_side(sides, plan.levels, args.duration, d, n, workdir, plan.rounds)


def print_sides(args: argparse.Namespace, plan: Plan, d: float | None, n: int, processes: int, names: list[str],
                sides: list[tuple], measured: list[list[dict]], bounds: dict, report: dict) -> int:
    """Each side's table, its rows into the report; the errors counted."""
    errors = 0
    for name, (side, _, side_inputs), rows in zip(names, sides, measured):
        errors += sum(r["errors"] for r in rows)
        for r in rows:
            r["run"], r["processes"] = name, processes if isinstance(side, Service) else 1
        title = (f"{name}: D = {d} ms, {n} device(s)" if plan.simulated else
                 f"{name}: backend {args.backend}, {n} worker(s)")
        if processes > 1 and isinstance(side, Service):
            title += f", {processes} processes on one port ({n // processes} each)"
        if plan.rounds > 1:
            title += f", medians of {plan.rounds} alternating rounds"
        print_rows(f"{title} (load average {load_average()})", rows, bounds)
        for r in rows:
            r["table"] = title.replace(name, short_run_name(name, len(sides)))
        if args.backend == "cpu":
            print_estimated_row(MODEL)
        if isinstance(side, Service) and len(side_inputs) == len(plan.inputs) and not plan.detection:
            print("\n(raw uint8 tensor through /v2 binary: this service has no /v2; the hook "
                  "`v2_binary_request` in bench/device_capacity.py adds the row once it has)")
        report["points"] += rows
    return errors


def measure_grid(args: argparse.Namespace, plan: Plan, workdir: Path, report: dict) -> int:
    """Every device time x device count x process count, each run side by side; the errors."""
    errors = 0
    for d in plan.device_times:
        for n, processes in ((n, p) for n in plan.device_counts for p in plan.process_counts):
            if n % processes:
                print(f"\n({n} device(s) do not split evenly among {processes} processes: left out)")
                continue
            bounds = bounds_without_http(args, plan, d, n, report)
            names, sides, measured = measure_sides(args, plan, d, n, processes, workdir)
            errors += print_sides(args, plan, d, n, processes, names, sides, measured, bounds, report)
    return errors


def measure_stages(args: argparse.Namespace, plan: Plan, workdir: Path, report: dict) -> None:
    """Server CPU per request by stage, c=1, the first device time, one device: each run in turn."""
    d = plan.device_times[0]
    for checkout, settings in plan.runs:
        with Service(checkout, d, 1, args.backend, args.image_threads, stages=True, settings=settings) as svc:
            results = [stage_pass(svc, item, args.duration, workdir) for item in plan.inputs]
        for r in results:
            r["checkout"], r["settings"] = str(checkout), settings
        print_stages(f"{run_name(checkout, settings)}: server CPU ms per request by stage, c=1, D = {d} ms, 1 device "
                     f"(load average {load_average()})", results)
        report["stages"] += results


def main(argv: list[str] | None = None) -> int:
    global MODEL  # --model: every request path and the service's model
    args = parse_args(argv)
    chart = chart_path(args)
    if args.redraw:
        return redraw(args, chart)
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    if args.zmq:  # the ZMQ door's benchmark, run as the program it is (it builds on this module's service and wrk)
        return subprocess.run([sys.executable, str(ZMQ_CAPACITY), *(argv if argv is not None else sys.argv[1:])],
                              stdin=subprocess.DEVNULL).returncode
    MODEL = args.model
    plan = Plan.of(args)
    start_load = load_average()
    print(f"device capacity: {os.cpu_count()} cores, load average {start_load} at start; wrk -t1, "
          f"{args.duration} s per point; image threads {plan.image_threads}; "
          f"backend {'cpu vs naive peer' if args.peer else args.backend}")
    report: dict = {"points": [], "stages": [], "bounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if plan.detection:  # the simulated device answers with the frame the benchmark sends (the services inherit it)
            photo = workdir / "frame.jpg"
            photo.write_bytes(plan.inputs[0].jpeg)
            os.environ["BENCH_DEVICE_PHOTO"] = str(photo)
        if args.peer:
            return measure_peer(args, plan, workdir)
        if args.url:
            return measure_running(args, plan, workdir, chart)
        errors = measure_grid(args, plan, workdir, report)
        if plan.simulated and not args.no_stages:
            measure_stages(args, plan, workdir, report)
    report["chart_title"] = (f"device busy against concurrency ({os.cpu_count()} cores, load average {start_load} "
                             f"at start; wrk -t1, {args.duration} s a point)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    charted(report, chart, report["chart_title"])
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main())
