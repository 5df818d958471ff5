"""Reload under steady load, then SIGTERM: is every request answered, and what do reloads cost?

Starts the service, runs `--clients` threads classifying a real photo back to back over
keep-alive connections, measures a baseline, then reloads the model `--reloads` times while
the clients go on, then sends SIGTERM with the clients still running. Prints requests,
reloads, failures (a non-200 before shutdown), unanswered (no answer within the client's
deadline), p50/p99 without reloads vs during reloads, and the time SIGTERM took to exit.

Example usage:
    python -m bench.reload_under_load                      # 4 clients, 20 reloads, cpu, 2 workers
    python -m bench.reload_under_load --clients 8 --reloads 50 --interval 0.2 --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import bench_service, default_photo
from bench.stats import median, percentile_or_none

MODEL = "efficientnet_lite0"
SHUTDOWN_LIMIT_S = 60  # the longest this script waits for the service to exit


@dataclass
class Outcome:
    start: float
    end: float
    status: int | None  # None: no HTTP answer
    error: str | None = None


def _client(port: int, photo: bytes, deadline_s: float, stop: threading.Event, out: list[Outcome]) -> None:
    """Back-to-back classifications on one keep-alive connection (a new one after an error)."""
    conn = None
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline_s)
        start = time.monotonic()
        try:
            conn.request("POST", f"/v1/models/{MODEL}/classify", body=photo, headers={"Content-Type": "image/jpeg"})
            response = conn.getresponse()
            response.read()
            out.append(Outcome(start, time.monotonic(), response.status))
        except TimeoutError:
            out.append(Outcome(start, time.monotonic(), None, "timeout"))
            conn.close()
            conn = None
        except OSError as e:  # refused or reset: after SIGTERM the service stops accepting
            out.append(Outcome(start, time.monotonic(), None, type(e).__name__))
            conn.close()
            conn = None
            if stop.wait(0.05):
                break
        except http.client.HTTPException as e:  # the connection closed between requests
            out.append(Outcome(start, time.monotonic(), None, type(e).__name__))
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


def _post(port: int, path: str, timeout_s: float) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def measure(clients: int, reloads: int, interval_s: float, baseline_s: float, deadline_s: float,
            workers: int, drain_s: float, photo: Path) -> dict:
    data = photo.read_bytes()
    service = bench_service(workers, extra={"EDGETPU_SERVE_DRAIN_TIMEOUT_S": str(drain_s)})
    with service:
        stop, outcomes = threading.Event(), [[] for _ in range(clients)]
        threads = [threading.Thread(target=_client, args=(service.port, data, deadline_s, stop, out), daemon=True)
                   for out in outcomes]
        for t in threads:
            t.start()
        time.sleep(baseline_s)
        reloads_from = time.monotonic()
        reload_status = []
        for _ in range(reloads):
            reload_status.append(_post(service.port, f"/v1/models/{MODEL}/reload", deadline_s))
            time.sleep(interval_s)
        reloads_until = time.monotonic()
        time.sleep(interval_s)
        term_at = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        try:
            exit_code = service.process.wait(SHUTDOWN_LIMIT_S)
        except subprocess.TimeoutExpired:
            exit_code = None
        shutdown_s = time.monotonic() - term_at
        stop.set()
        for t in threads:
            t.join(deadline_s + 1)
    every = [o for out in outcomes for o in out]
    before = [o for o in every if o.start < term_at]
    baseline = [o.end - o.start for o in before if o.status == 200 and o.end < reloads_from]
    during = [o.end - o.start for o in before if o.status == 200 and reloads_from <= o.start < reloads_until]
    return {
        "clients": clients,
        "workers": workers,
        "requests": len(before),
        "ok": sum(o.status == 200 for o in before),
        "reloads": len(reload_status),
        "reloads_ok": sum(s == 200 for s in reload_status),
        # a non-200 answer, or a connection lost while the service was not shutting down
        "failures": sum((o.status is not None and o.status != 200)
                        or (o.status is None and o.error != "timeout" and o.end < term_at) for o in before),
        "unanswered": sum(o.error == "timeout" for o in every),
        "refused_after_sigterm": sum(o.status is None and o.error != "timeout" and o.end >= term_at for o in every),
        "p50_ms_without_reloads": _ms(median(baseline) if baseline else None),
        "p99_ms_without_reloads": _ms(percentile_or_none(baseline, 99)),
        "p50_ms_during_reloads": _ms(median(during) if during else None),
        "p99_ms_during_reloads": _ms(percentile_or_none(during, 99)),
        "shutdown_s": round(shutdown_s, 3),
        "exit_code": exit_code,
        "drain_timeout_s": drain_s,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client threads classifying back to back")
    parser.add_argument("--reloads", type=int, default=20, help="reloads of the model while the clients run")
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between reloads")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of load before the first reload")
    parser.add_argument("--deadline", type=float, default=30.0, help="a request not answered in this long is "
                        "counted unanswered")
    parser.add_argument("--workers", type=int, default=2, help="interpreters of the service (EDGETPU_SERVE_WORKERS)")
    parser.add_argument("--drain", type=float, default=10.0, help="the service's EDGETPU_SERVE_DRAIN_TIMEOUT_S")
    parser.add_argument("--photo", type=Path, default=None, help="the image to classify (default: china.jpg)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    figures = measure(args.clients, args.reloads, args.interval, args.baseline, args.deadline, args.workers,
                      args.drain, args.photo or default_photo())
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(map(len, figures))
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
    return 0 if figures["failures"] == 0 and figures["unanswered"] == 0 and figures["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
