"""Does the ZMQ door keep the accelerators busy? Frigate-like clients against simulated devices, beside HTTP and a naive
peer. Run through `python bench/device_capacity.py --zmq ...` (or this file directly, the same arguments).

For each device time D and device count n, one service (bench/device_launcher.py: the simulated device of
bench/simulated_device.py, one interpreter per device, D ms per invoke with the GIL released) serving a 320x320
uint8 SSD (tests/detection_models.py's tiny detector at Frigate's default size, built here) with its ZMQ door on.
At each client count c:
  - ZMQ: c Frigate-like clients (bench/zmq_load.py: a REQ socket each, one tensor in flight each, in a process of
    their own) sending the 320x320 tensor;
  - HTTP: the same tensor through OIP v2's binary extension, `wrk` with c connections (the cheapest HTTP path);
and, per D, the naive peer (bench/naive_zmq_peer.py: a REP socket calling the device directly, one request at a
time) with the same clients. Reported: answered per second, p50/p99 round trip, device busy (req/s x D / n) and
the server's CPU per request (every thread, /proc/<pid>/task/*/schedstat); for ZMQ also the device's time as the
service measured its invokes (/metrics' inference stage), since a sleep of D ms takes longer on a loaded machine.

With several `--checkout`s (or `--rounds` above 1), every checkout's service and the naive peer are up at once and
each point is measured in alternating rounds across them, each figure the median over the rounds (as
bench/device_capacity.py does for HTTP: one side measured after another is biased by what the machine did meanwhile).

Example usage:
    python bench/device_capacity.py --zmq --device-ms 7 --devices 4 --concurrency 1,2,4,8
    python bench/device_capacity.py --zmq --device-ms 7 --devices 1,2,4,8,12 --concurrency 16 --json zmq.json
    python bench/device_capacity.py --zmq --checkout /work/main --checkout . --concurrency 1,8 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average, repo_root  # noqa: E402
from bench.device_capacity import Input, Service, thread_cpu_ns, wrk_run  # noqa: E402
from bench.service import ServiceProcess, free_port  # noqa: E402
from bench.stats import median  # noqa: E402

NAME = "frigate_ssd_320"
SIZE = 320
LOAD = Path(__file__).resolve().parent / "zmq_load.py"
PEER = Path(__file__).resolve().parent / "naive_zmq_peer.py"


def build_model(root: Path) -> Path:
    """A 320x320 uint8 SSD ending in TFLite_Detection_PostProcess (outputs in TF1's order, as Frigate reads them)."""
    from app.model_dir.writing import write_model_dir
    from tests.detection_models import output_names, tiny_detector

    manifest = {"name": NAME, "task": "detection", "source": "bench/zmq_capacity.py (tests/detection_models.py)",
                "licence": "MIT", "input": {"width": SIZE, "height": SIZE, "resize": "stretch", "mean": [0],
                                            "std": [255]}, "outputs": output_names("tf1")}
    return write_model_dir(root, manifest, {"int8": (f"{NAME}_int8.tflite", tiny_detector(SIZE, order="tf1"))})


def frigate_load(endpoint: str, clients: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, str(LOAD), endpoint, NAME, str(SIZE), str(SIZE), str(clients), str(seconds)],
                         capture_output=True, text=True, timeout=seconds + 120, cwd=repo_root())
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"zmq_load failed: {out.stdout}\n{out.stderr}")
    return json.loads(lines[-1])


def v2_tensor(model: str) -> Input:
    """The 320x320 tensor through OIP v2's binary extension (every output: the detector's four tensors)."""
    import numpy as np

    tensor = np.random.default_rng(0).integers(0, 256, (1, SIZE, SIZE, 3), dtype=np.uint8)
    header = json.dumps({"inputs": [{"name": "image", "shape": list(tensor.shape), "datatype": "UINT8",
                                     "parameters": {"binary_data_size": tensor.nbytes}}]}).encode()
    return Input("raw uint8 tensor, /v2 binary", header + tensor.tobytes(), "application/octet-stream",
                 path=f"/v2/models/{model}/infer", headers={"Inference-Header-Content-Length": str(len(header))})


def device_seconds(url: str | None) -> tuple[float, float]:
    """The service's own inference stage so far (sum of seconds, count), from /metrics: what the simulated device
    really took (a sleep of D ms takes longer on a loaded machine)."""
    if url is None:
        return 0.0, 0.0
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        if line.startswith("edgetpu_serve_stage_seconds_") and 'stage="inference"' in line and f'model="{NAME}"' in line:
            kind = line.split("{", 1)[0].rsplit("_", 1)[1]
            if kind in found:
                found[kind] += float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


def point(process_pid: int | None, measure, d_ms: float, devices: int, url: str | None = None, **labels) -> dict:
    before = thread_cpu_ns(process_pid) if process_pid else {}
    seconds_before, count_before = device_seconds(url)
    figures = measure()
    seconds_after, count_after = device_seconds(url)
    if count_after > count_before:  # the device's own time, as the service measured its invokes
        figures["device_ms_measured"] = (seconds_after - seconds_before) / (count_after - count_before) * 1000
    row = {**labels, "device_ms": d_ms, "devices": devices, **figures,
           "device_busy": figures["req_s"] * d_ms / 1000 / devices}
    if process_pid:
        after = thread_cpu_ns(process_pid)
        row["cpu_ms_per_request_total"] = sum(ns - before.get(t, 0) for t, ns in after.items()) \
            / max(1, figures["requests"]) / 1e6
    return row


# bench/naive_zmq_peer.py's shapes: its NAIVE_SHAPE -> what the tables call it
PEERS = {"rep": "naive REP peer", "loop": "event loop + device thread peer"}


class NaivePeer(ServiceProcess):
    def __init__(self, model: Path, device_ms: float, endpoint: str, shape: str = "rep"):
        self.endpoint = endpoint
        env = {"PYTHONPATH": str(repo_root()), "NAIVE_MODEL": str(model), "NAIVE_ENDPOINT": endpoint,
               "BENCH_DEVICE_MS": str(device_ms), "BENCH_DEVICES": "1", "NAIVE_SHAPE": shape}
        super().__init__(env, argv=[sys.executable, str(PEER)], port=free_port())

    def wait_ready(self, timeout_s: float = 60) -> NaivePeer:  # no HTTP: ready once a model_request is answered
        import zmq

        with zmq.Context() as context, context.socket(zmq.REQ) as sock:
            sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            sock.send_multipart([json.dumps({"model_request": True, "model_name": NAME}).encode()])
            sock.recv_multipart()
        return self


def measure(device_times: list[float], device_counts: list[int], levels: list[int], seconds: float,
            workdir: Path, checkouts: list[Path] | None = None, rounds: int = 1) -> dict:
    """Every checkout's service (default: this one) and the naive peer up at once per (D, n), each point measured
    `rounds` times in alternating order across them; each row the median over its rounds."""
    checkouts = checkouts or [repo_root()]
    model_dir = build_model(workdir / "models")
    report: dict = {"zmq": [], "http": [], "peer": []}
    for d in device_times:
        for n in device_counts:
            with contextlib.ExitStack() as stack:
                sides = []
                for i, checkout in enumerate(checkouts):
                    endpoint = f"ipc://{workdir}/zmq-{n}-{i}"
                    settings = {"MODELS": NAME, "MODEL_DIR": str(workdir / "models"), "ZMQ_ENDPOINT": endpoint,
                                "DEFAULT_DETECTION_MODEL": NAME, "MAX_WAITING": "64"}
                    svc = stack.enter_context(Service(checkout, d, n, "simtpu", None, settings=settings))
                    frigate_load(endpoint, max(levels), 1.0)  # warm
                    wrk_run(svc.url, v2_tensor(NAME), max(levels), 1.0, workdir)
                    sides.append((str(checkout), endpoint, svc))
                peers = []
                for shape in PEERS:
                    peer_endpoint = f"ipc://{workdir}/peer-{n}-{shape}"  # as the services' (ipc)
                    peer = stack.enter_context(NaivePeer(model_dir / f"{NAME}_int8.tflite", d, peer_endpoint, shape))
                    frigate_load(peer_endpoint, 1, 1.0)
                    peers.append((shape, peer_endpoint, peer))
                for c in levels:
                    measured: dict[tuple[str, str], list[dict]] = {}
                    for r in range(rounds):
                        for checkout, endpoint, svc in (sides if r % 2 == 0 else sides[::-1]):
                            measured.setdefault(("zmq", checkout), []).append(
                                point(svc.process.pid, lambda: frigate_load(endpoint, c, seconds), d, n, svc.url,
                                      path="ZMQ", clients=c, checkout=checkout))
                            measured.setdefault(("http", checkout), []).append(
                                point(svc.process.pid, lambda: wrk_run(svc.url, v2_tensor(NAME), c, seconds, workdir),
                                      d, n, path="HTTP /v2 binary", clients=c, checkout=checkout))
                        for shape, peer_endpoint, peer in (peers if r % 2 == 0 else peers[::-1]):
                            measured.setdefault(("peer", shape), []).append(
                                point(peer.process.pid, lambda: frigate_load(peer_endpoint, c, seconds), d, 1,
                                      path=PEERS[shape], clients=c))
                    for (kind, _), rows in measured.items():
                        report[kind].append(median_row(rows))
            for checkout, _, _ in sides:
                title = f"D = {d} ms, {n} simulated device(s), one process"
                if len(sides) > 1:
                    title += f", {checkout}"
                if rounds > 1:
                    title += f", medians of {rounds} alternating rounds"
                print_table(f"{title} (load average {load_average()})",
                            [r for r in report["zmq"] if (r["device_ms"], r["devices"], r["checkout"]) == (d, n, checkout)],
                            [r for r in report["http"] if (r["device_ms"], r["devices"], r["checkout"]) == (d, n, checkout)])
            for shape in PEERS:
                print_peer(d, shape, [r for r in report["peer"][-len(levels) * len(PEERS):]
                                      if r["path"] == PEERS[shape]])
    return report


def median_row(rows: list[dict]) -> dict:
    """One point's rounds as one row: each figure's median (timeouts and zero rows: their sum), device busy from the
    median rate."""
    row = dict(rows[0])
    for key, value in rows[0].items():
        if key in ("errors", "zero_rows", "requests"):
            row[key] = sum(r[key] for r in rows)
        elif isinstance(value, float) and key != "device_ms":
            found = [r[key] for r in rows if r.get(key) is not None]
            row[key] = median(found) if found else None
    row["device_busy"] = row["req_s"] * row["device_ms"] / 1000 / row["devices"]
    row["rounds"] = len(rows)
    return row


def _cell(r: dict) -> str:
    cpu = f", {r['cpu_ms_per_request_total']:.2f}" if "cpu_ms_per_request_total" in r else ""
    p50 = f"{r['p50_ms']:.2f}" if r.get("p50_ms") is not None else "-"
    device = f" [device {r['device_ms_measured']:.2f} ms]" if "device_ms_measured" in r else ""
    return f"{r['req_s']:.0f} ({p50}){device}, {r['device_busy']:.0%}{cpu}"


def print_table(title: str, zmq_rows: list[dict], http_rows: list[dict]) -> None:
    print(f"\n{title}\n")
    print("| clients | ZMQ: req/s (p50 ms), device busy, server CPU ms/req | HTTP /v2 binary: the same |")
    print("|---|---|---|")
    for z, h in zip(zmq_rows, http_rows):
        errors = f" [{z['errors']} timeouts, {z['zero_rows']} zero rows]" if z["errors"] else ""
        print(f"| {z['clients']} | {_cell(z)}{errors} | {_cell(h)} |")


def print_peer(d: float, shape: str, rows: list[dict]) -> None:
    how = ("one request at a time" if shape == "rep" else
           "one device thread beside the event loop, the service's shape with nothing else")
    print(f"\n{PEERS[shape]} (bench/naive_zmq_peer.py, NAIVE_SHAPE={shape}), D = {d} ms: {how}, one device\n")
    print("| clients | req/s (p50 ms), one device's busy, its CPU ms/req |")
    print("|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {_cell(r)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device-ms", default="7", help="simulated device times, ms (comma-separated)")
    parser.add_argument("--devices", default="4", help="device counts (comma-separated)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="Frigate-like clients (comma-separated)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measured point")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    parser.add_argument("--checkout", action="append", type=Path, default=None,
                        help="checkout(s) to serve from, side by side (default: this one)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds per point, medians reported (default: 3 with several checkouts, else 1)")
    args, _ = parser.parse_known_args(argv)
    checkouts = [c.resolve() for c in args.checkout] if args.checkout else None
    rounds = args.rounds or (3 if checkouts and len(checkouts) > 1 else 1)
    print(f"ZMQ capacity: load average {load_average()} at start; {args.duration} s per point")
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        report = measure([float(d) for d in args.device_ms.split(",")], [int(n) for n in args.devices.split(",")],
                         [int(c) for c in args.concurrency.split(",")], args.duration, Path(tmp), checkouts, rounds)
    report["seconds"] = round(time.time() - started)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if any(r["errors"] for rows in report.values() if isinstance(rows, list) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
