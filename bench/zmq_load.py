"""Frigate-like load on a ZMQ detector endpoint: C clients, each a REQ socket on a thread of its own sending one
uint8 tensor after another (as Frigate's `zmq` detector does, one request in flight per detector), in a process
of its own so that its CPU is not the server's. Prints one JSON line: answered per second, round-trip p50/p99 (ms),
how many replies were zero rows, and timeouts.

Run by bench/zmq_capacity.py:
    python bench/zmq_load.py ENDPOINT MODEL_NAME HEIGHT WIDTH CLIENTS SECONDS
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.frigate_client import decode  # noqa: E402
from bench.stats import percentile_or_none  # noqa: E402

TIMEOUT_MS = 10_000
WARMUP_S = 0.5


def client(context: zmq.Context, endpoint: str, model: str, tensor: np.ndarray, stop: float, warm: float,
           out: dict) -> None:
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send_multipart([json.dumps({"model_request": True, "model_name": model}).encode()])
    sock.recv_multipart()
    header = json.dumps({"shape": list(tensor.shape), "dtype": "uint8", "model_type": "ssd"}).encode()
    payload = memoryview(np.ascontiguousarray(tensor)).cast("B")
    latencies, zero, timeouts = [], 0, 0
    while (now := time.perf_counter()) < stop:
        try:
            sock.send_multipart([header, payload], copy=False)
            reply = sock.recv_multipart()
        except zmq.Again:
            timeouts += 1
            sock.close(linger=0)
            sock = context.socket(zmq.REQ)
            sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            continue
        if now >= warm:
            latencies.append(time.perf_counter() - now)
            zero += not decode(reply).any()
    sock.close(linger=0)
    out.update(latencies=latencies, zero=zero, timeouts=timeouts)


def run(endpoint: str, model: str, height: int, width: int, clients: int, seconds: float) -> dict:
    tensor = np.random.default_rng(0).integers(0, 256, (1, height, width, 3), dtype=np.uint8)
    context = zmq.Context()
    start = time.perf_counter()
    warm, stop = start + WARMUP_S, start + WARMUP_S + seconds
    results = [{} for _ in range(clients)]
    threads = [threading.Thread(target=client, args=(context, endpoint, model, tensor, stop, warm, results[i]))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    context.term()
    latencies = np.concatenate([r["latencies"] for r in results]) * 1000
    n = len(latencies)
    return {"req_s": n / seconds, "requests": n, "p50_ms": percentile_or_none(latencies, 50),
            "p99_ms": percentile_or_none(latencies, 99),
            "zero_rows": sum(r["zero"] for r in results), "errors": sum(r["timeouts"] for r in results)}


if __name__ == "__main__":
    endpoint, model, height, width, clients, seconds = sys.argv[1:7]
    print(json.dumps(run(endpoint, model, int(height), int(width), int(clients), float(seconds))))
