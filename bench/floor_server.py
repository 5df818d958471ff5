"""The floor: the least a Python server on our HTTP stack can do for one classification request.

What the device-capacity targets are judged against. The same uvicorn, httptools and uvloop as
the service, a bare ASGI app, and for each POST, all on the event loop with no thread hand-off:
read the body, the same image work (app.imaging: decode, crop and resize, quantize: the bytes
the service hands its engine), the same simulated device (bench/simulated_device.py: D ms with
the GIL released), the same post-processing (dequantize, softmax, top 5, labels) and an orjson
answer. No limits, admission, metrics, errors or timings: nothing a deployed service needs.

With everything on the loop one request runs at a time, so this is the floor for concurrency 1
(latency, CPU per request), not for throughput (the bound without HTTP in device_capacity.py is).

    PYTHONPATH=. BENCH_DEVICE_MS=2.5 FLOOR_PORT=8100 python bench/floor_server.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulated_device, beside this file

import simulated_device  # noqa: E402

from app.imaging import prepare  # noqa: E402
from app.imaging.decoding import reuse_image_buffers  # noqa: E402
from app.imaging.quantization import InputQuantizer  # noqa: E402
from app.tasks.classify import scores, top_predictions  # noqa: E402
from app.model_dir.reading import read_model_dir  # noqa: E402

MODEL_DIR = read_model_dir(Path(__file__).resolve().parents[1] / "models" / "efficientnet_lite0")
SPEC = MODEL_DIR.manifest.input
ENGINE = simulated_device.SimulatedTpuEngine.load(MODEL_DIR.file("int8"), None)
QUANTIZER = InputQuantizer(SPEC, ENGINE.inputs[0].dtype, ENGINE.inputs[0].scale, ENGINE.inputs[0].zero_point)
JSON_HEADERS = [(b"content-type", b"application/json")]
reuse_image_buffers()  # as the service does at start


def classify(data: bytes) -> bytes:
    tensor = QUANTIZER(prepare(data, SPEC, simulated_device.MAX_PIXELS))
    (output,) = ENGINE.run([tensor])
    values = scores(output, ENGINE.outputs[0].scale, ENGINE.outputs[0].zero_point, MODEL_DIR)
    predictions = top_predictions(values, MODEL_DIR.labels, 5, 0.0)
    return orjson.dumps({"predictions": [{"index": p.index, "label": p.label, "score": p.score}
                                         for p in predictions]})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = classify(b"".join(chunks)) if scope["method"] == "POST" else b"{}"
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["FLOOR_PORT"]), log_level="warning",
                access_log=False, http="httptools", loop="uvloop", lifespan="off")
