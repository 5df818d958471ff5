"""A naive peer for the ZMQ door, for side-by-side figures only: what a minimal server of Frigate's ZMQ detector
protocol does (frigate-nvr/apple-silicon-detector's shape, on a TFLite model): a REP socket, one request at a time,
the tensor straight into the interpreter, Frigate's SSD rule on the outputs, the rows back. Not part of the product.

The interpreter is the benchmark's simulated device by default (bench/simulated_device.py: D ms per invoke, the
model's real outputs), so the peer and the service run the same device; NAIVE_REAL=1 runs the model on
ai-edge-litert instead. One REP socket runs one invoke at a time, so however many devices there are, it feeds one.

NAIVE_SHAPE=loop gives the floor of the service's own shape instead: a ROUTER socket read from an asyncio event
loop, the invoke on a thread of its own (a queue.SimpleQueue to it, call_soon_threadsafe back), and nothing else.
Any server that keeps its socket apart from its devices, so that one process feeds several, pays those two thread
hand-offs per request; the REP peer pays none (it sleeps on the thread that reads its socket).

    NAIVE_MODEL=DIR/NAME_int8.tflite NAIVE_ENDPOINT=tcp://127.0.0.1:5556 BENCH_DEVICE_MS=7 python bench/naive_zmq_peer.py
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.frontdoors.frigate import ssd_rows  # noqa: E402  (Frigate's rule, the one the service answers with)

MODEL = Path(os.environ["NAIVE_MODEL"])
ZERO = np.zeros((20, 6), np.float32)
HEADER = json.dumps({"shape": [20, 6], "dtype": "float32"}).encode()


def interpreter():
    """run(tensor) -> the four outputs in the model's order (Frigate reads them by position)."""
    if os.environ.get("NAIVE_REAL") == "1":
        from ai_edge_litert.interpreter import Interpreter

        tflite = Interpreter(model_path=str(MODEL), num_threads=1)
        tflite.allocate_tensors()
        index = tflite.get_input_details()[0]["index"]
        outputs = [d["index"] for d in tflite.get_output_details()]

        def run(tensor):
            tflite.set_tensor(index, tensor)
            tflite.invoke()
            return [tflite.get_tensor(i) for i in outputs]
        return run
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import simulated_device

    engine = simulated_device.SimulatedTpuEngine.load(MODEL, None)
    return lambda tensor: engine.run([tensor])


def answer(run, frames: list) -> list[bytes]:
    """One request's reply frames (the model check's, or the rows; zeros for anything that fails)."""
    header = json.loads(bytes(frames[0]))
    if header.get("model_request"):
        return [json.dumps({"model_available": True, "model_loaded": True}).encode()]
    try:
        tensor = np.frombuffer(frames[1], np.dtype(header["dtype"])).reshape(header["shape"])
        rows = ssd_rows(*run(tensor))
    except Exception:  # noqa: BLE001  a naive peer answers zeros, as the reference server does
        rows = ZERO
    return [HEADER, rows.tobytes()]


def serve_rep(run, endpoint: str) -> None:
    sock = zmq.Context().socket(zmq.REP)
    sock.bind(endpoint)
    while True:
        sock.send_multipart(answer(run, sock.recv_multipart()))


async def serve_loop(run, endpoint: str) -> None:
    """NAIVE_SHAPE=loop: a ROUTER read from the event loop by its descriptor, each invoke on one device thread."""
    loop = asyncio.get_running_loop()
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def device() -> None:
        while True:
            future, tensor = jobs.get()
            try:
                loop.call_soon_threadsafe(future.set_result, run(tensor))
            except Exception as e:  # noqa: BLE001
                loop.call_soon_threadsafe(future.set_exception, e)

    def device_run(tensor):
        future = loop.create_future()
        jobs.put((future, tensor))
        return future

    async def reply(frames: list) -> None:
        envelope, body = frames[:2], frames[2:]  # a REQ peer's identity and empty delimiter
        header = json.loads(bytes(body[0]))
        if header.get("model_request") or len(body) != 2:
            out = answer(None, body)
        else:
            try:
                tensor = np.frombuffer(body[1], np.dtype(header["dtype"])).reshape(header["shape"])
                out = [HEADER, ssd_rows(*await device_run(tensor)).tobytes()]
            except Exception:  # noqa: BLE001
                out = [HEADER, ZERO.tobytes()]
        sock.send_multipart([*envelope, *out], zmq.NOBLOCK)
        loop.call_soon(pump)  # the send may have taken the descriptor's edge

    replies: set[asyncio.Task] = set()

    def pump() -> None:
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            task = loop.create_task(reply(sock.recv_multipart(zmq.NOBLOCK, copy=False)))
            replies.add(task)
            task.add_done_callback(replies.discard)

    threading.Thread(target=device, daemon=True).start()
    loop.add_reader(sock.getsockopt(zmq.FD), pump)
    pump()
    await asyncio.Event().wait()


def main() -> None:
    run, endpoint = interpreter(), os.environ["NAIVE_ENDPOINT"]
    if os.environ.get("NAIVE_SHAPE") == "loop":
        asyncio.run(serve_loop(run, endpoint))
    else:
        serve_rep(run, endpoint)


if __name__ == "__main__":
    main()
