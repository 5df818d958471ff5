"""A naive peer for the ZMQ door, for side-by-side figures only: what a minimal server of Frigate's ZMQ detector
protocol does (frigate-nvr/apple-silicon-detector's shape, on a TFLite model): a REP socket, one request at a time,
the tensor straight into the interpreter, Frigate's SSD rule on the outputs, the rows back. Not part of the product.

The interpreter is the benchmark's simulated device by default (bench/simulated_device.py: D ms per invoke, the
model's real outputs), so the peer and the service run the same device; NAIVE_REAL=1 runs the model on
ai-edge-litert instead. One REP socket runs one invoke at a time, so however many devices there are, it feeds one.

    NAIVE_MODEL=DIR/NAME_int8.tflite NAIVE_ENDPOINT=tcp://127.0.0.1:5556 BENCH_DEVICE_MS=7 python bench/naive_zmq_peer.py
"""

from __future__ import annotations

import json
import os
import sys
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


def main() -> None:
    run = interpreter()
    sock = zmq.Context().socket(zmq.REP)
    sock.bind(os.environ["NAIVE_ENDPOINT"])
    while True:
        frames = sock.recv_multipart()
        header = json.loads(frames[0])
        if header.get("model_request"):
            sock.send_multipart([json.dumps({"model_available": True, "model_loaded": True}).encode()])
            continue
        try:
            tensor = np.frombuffer(frames[1], np.dtype(header["dtype"])).reshape(header["shape"])
            boxes, classes, scores, count = run(tensor)
            rows = ssd_rows(boxes, classes, scores, count)
        except Exception:  # noqa: BLE001  a naive peer answers zeros, as the reference server does
            rows = ZERO
        sock.send_multipart([HEADER, rows.tobytes()])


if __name__ == "__main__":
    main()
