"""Several service processes (replicas), each with its own simulated devices and its own port, the load split
evenly: the comparison for `device_capacity.py --processes P` (P workers on ONE port, under gunicorn).

On a real host the same shape is P `python -m app` on P ports, each with EDGETPU_SERVE_DEVICE_SHARE=k/P and
one EDGETPU_SERVE_DEVICE_CLAIMS_DIR (they share the TPUs by claims), behind a balancer. This measures it
without the balancer: P copies of the very service bench/device_capacity.py starts (bench/device_launcher.py,
simulated devices), on P ports, P wrk processes at c/P connections each, all at once. Reported per point:
total req/s (2xx), device busy over all P x k devices, shed (non-2xx) answers apart, p50/p99 (the worst
replica's), server CPU ms per request (all threads of all replicas).

    python replicas.py --device-ms 2.6 --configs 4x2,4x3 --concurrency 32,64 --duration 3 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJ = Path(os.environ.get("PROJ", Path(__file__).resolve().parent / "proj"))
sys.path.insert(0, str(PROJ))

from bench.common import load_average, repo_root  # noqa: E402
from bench.device_capacity import (MODEL, WARMUP_S, Service, jpeg_inputs, thread_cpu_ns,  # noqa: E402
                                   v2_binary_request, wrk_run)


def parallel(calls):
    """Run the zero-argument callables at once in threads; their results in order (re-raise the first error)."""
    results, errors = [None] * len(calls), []

    def one(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device-ms", type=float, default=2.6)
    parser.add_argument("--configs", default="4x2", help="PROCESSESxDEVICES_EACH, comma-separated")
    parser.add_argument("--concurrency", default="32,64", help="total connections, split evenly over the processes")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    d = args.device_ms
    configs = [tuple(int(x) for x in c.lower().split("x")) for c in args.configs.split(",") if c]
    levels = [int(c) for c in args.concurrency.split(",")]
    small = jpeg_inputs()[0]
    rows = []
    print(f"replicas: {os.cpu_count()} cores, load average {load_average()}; D = {d} ms; checkout {repo_root()}")
    for processes, each in configs:
        with contextlib.ExitStack() as stack:
            services = []
            for _ in range(processes):  # started at once, then waited for
                svc = Service(repo_root(), d, each, "simtpu", None)
                stack.callback(svc.stop)
                services.append(svc)
            t0 = time.monotonic()
            for svc in services:
                svc.wait_ready()
            print(f"\n{processes} processes x {each} devices: ready in {time.monotonic() - t0:.1f} s")
            v2 = [v2_binary_request(s.url, MODEL, small.jpeg) for s in services]
            items = [small] + ([v2[0]] if all(v2) else [])
            workdirs = [Path(stack.enter_context(tempfile.TemporaryDirectory())) for _ in services]
            print("| input | c (total) | req/s (2xx) | device busy | shed | p50 ms (worst) | p99 ms (worst) "
                  "| server CPU ms/req | CPU cores used | errors |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for item in items:
                per = [item if item is small else v for v in v2]
                parallel([lambda s=s, it=it, w=w: wrk_run(s.url, it, max(1, max(levels) // processes), WARMUP_S, w)
                          for s, it, w in zip(services, per, workdirs)])
                for c in levels:
                    each_c = max(1, c // processes)
                    before = [thread_cpu_ns(s.process.pid) for s in services]
                    figures = parallel([lambda s=s, it=it, w=w: wrk_run(s.url, it, each_c, args.duration, w)
                                        for s, it, w in zip(services, per, workdirs)])
                    after = [thread_cpu_ns(s.process.pid) for s in services]
                    cpu_ns = sum(ns - b.get(tid, 0) for a, b in zip(after, before) for tid, ns in a.items())
                    requests = sum(f["requests"] for f in figures)
                    req_s = sum(f["req_s"] for f in figures)
                    row = {"input": item.name, "processes": processes, "devices_each": each,
                           "devices": processes * each, "device_ms": d, "concurrency": each_c * processes,
                           "req_s": req_s, "device_busy": req_s * d / 1000 / (processes * each),
                           "p50_ms": max(f["p50_ms"] for f in figures), "p99_ms": max(f["p99_ms"] for f in figures),
                           "per_process_req_s": [f["req_s"] for f in figures], "requests": requests,
                           "shed": sum(f.get("shed", 0) for f in figures), "errors": sum(f["errors"] for f in figures),
                           "cpu_ms_per_request_total": cpu_ns / max(1, requests) / 1e6}
                    row["cpu_cores_used"] = row["cpu_ms_per_request_total"] * req_s / 1000
                    rows.append(row)
                    print(f"| {item.name} | {row['concurrency']} | {req_s:.0f} | {row['device_busy']:.0%} | "
                          f"{row['shed']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['cpu_ms_per_request_total']:.2f} | "
                          f"{row['cpu_cores_used']:.1f} | {row['errors']} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"points": rows}, indent=2))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
