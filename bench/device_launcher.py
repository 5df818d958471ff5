"""`python -m app` with the simulated device plugged in: what bench/device_capacity.py starts.

Run as a script (`python bench/device_launcher.py`, the checkout under test first on
PYTHONPATH): it registers bench/simulated_device.py's plug-in (`app.engines.register`; on a
checkout without plug-ins, an entry in `app.engines.ENGINES`), then runs the app exactly as
`python -m app` does, through `app.__main__.main()`: the one call into the server module.

Measurement hooks, for the benchmark only:
  SIGUSR1   writes {"threads": {native id: name}, "stages": {stage: [cpu ns, calls]}} to
            $BENCH_STATS_FILE, so the benchmark can name each thread's CPU clock in /proc.
  BENCH_STAGES=1  wraps the stage functions (decode, resize, quantize, body read, post-processing,
            serialization, the device's copies; a detector's and DeepStack's routes too) to add up
            their thread CPU time. Costs about a microsecond per call; the benchmark uses it in a
            separate pass, not for its req/s.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulated_device, not this checkout's bench/

import simulated_device  # noqa: E402

STAGES: dict[str, list[int]] = {}
_lock = threading.Lock()


def _add(stage: str, ns: int) -> None:
    with _lock:
        entry = STAGES.setdefault(stage, [0, 0])
        entry[0] += ns
        entry[1] += 1


def _timed(stage: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(stage, time.thread_time_ns() - start)
    return wrapper


def _timed_async(stage: str, fn):
    """Thread CPU of a coroutine from start to end: exact only while no other request runs on
    the loop meanwhile (the stage pass runs at concurrency 1)."""
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        start = time.thread_time_ns()
        try:
            return await fn(*args, **kwargs)
        finally:
            _add(stage, time.thread_time_ns() - start)
    return wrapper


def instrument() -> None:
    try:  # one module per task door, until the native routes were made from the task list (app/api/native.py)
        import app.api.classify as classify_api
    except ImportError:
        classify_api = None
    try:  # the image work in the core since the request path became a library (app/core/)
        import app.core.images as inference
    except ImportError:
        import app.inference as inference
    try:  # a pydantic copy of the classification's result, until a result became one type (app/tasks/base.py)
        from app.tasks.classify import ClassifyResponse
    except ImportError:
        try:
            from app.api.schemas import ClassifyResponse
        except ImportError:
            ClassifyResponse = None

    try:  # the classification task's post-processing, in its own module since the task seam
        import app.tasks.classify as post
    except ImportError:
        post = inference
    if hasattr(inference, "decode_with_source"):  # since detection: decoding also says what the original was
        inference.decode_with_source = _timed("decode", inference.decode_with_source)
    else:
        inference.decode = _timed("decode", inference.decode)
    inference.to_pixels = _timed("resize", inference.to_pixels)
    try:  # the quantizer in its own module since the image work was split (app/imaging/)
        from app.imaging.quantization import InputQuantizer
    except ImportError:
        from app.imaging import InputQuantizer
    InputQuantizer.__call__ = _timed("quantize", InputQuantizer.__call__)
    post.scores = _timed("post-processing", post.scores)
    post.top_predictions = _timed("post-processing", post.top_predictions)
    try:  # since the core: the native routes read their image body in app/api/held.py
        import app.api.held as held_api
    except ImportError:
        held_api = None
    if held_api is not None and hasattr(held_api, "image_bytes"):
        held_api.image_bytes = _timed_async("body read", held_api.image_bytes)
    elif hasattr(classify_api, "image_bytes"):
        classify_api.image_bytes = _timed_async("body read", classify_api.image_bytes)
    if hasattr(classify_api, "response_body"):  # orjson, straight from the dataclasses
        classify_api.response_body = _timed("response serialization", classify_api.response_body)
    elif classify_api is None:  # every task's native JSON: the answer's one envelope (Answer.json)
        from app.tasks import Answer
        Answer.json = _timed("response serialization", Answer.json)
    for name in ("model_validate", "model_dump_json") if ClassifyResponse is not None else ():
        original = getattr(ClassifyResponse, name)
        timed = _timed("response serialization", original)
        # model_validate is bound already (a classmethod): stored as a plain function on the class
        setattr(ClassifyResponse, name, staticmethod(timed) if name == "model_validate" else timed)
    run = simulated_device.SimulatedTpuEngine.run
    simulated_device.SimulatedTpuEngine.run = _timed("device copies", run)
    instrument_detection()


def instrument_detection() -> None:
    """The detection task's stages, on a checkout that has it: post-processing (boxes to pixels, labels), the
    body read of /v1/detect and DeepStack's routes (multipart with its form fields), their serialization (the
    native routes' in Answer.json, instrumented with the classification's, where they are made from the tasks)."""
    try:
        import app.api.deepstack as deepstack
        import app.tasks.detect as detect
    except ImportError:
        return
    try:
        import app.api.detect as detect_api
    except ImportError:
        detect_api = None
    if hasattr(detect, "DetectionTask") and hasattr(detect.DetectionTask, "read"):  # the task reads its outputs itself
        detect.DetectionTask.read = _timed("post-processing", detect.DetectionTask.read)
    else:
        detect.objects = _timed("post-processing", detect.objects)
    if hasattr(detect_api, "image_bytes"):  # before the core: /v1/detect read its own body
        detect_api.image_bytes = _timed_async("body read", detect_api.image_bytes)
    deepstack.image_and_fields = _timed_async("body read", deepstack.image_and_fields)
    for module in (detect_api, deepstack):
        if module is not None:
            module.response_body = _timed("response serialization", module.response_body)


def _dump_stats(*_) -> None:
    path = os.environ.get("BENCH_STATS_FILE")
    if not path:
        return
    with _lock:
        stages = {k: list(v) for k, v in STAGES.items()}
    threads = {str(t.native_id): t.name for t in threading.enumerate()}
    threads[str(threading.main_thread().native_id)] = "event loop"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"threads": threads, "stages": stages}, f)
    os.replace(tmp, path)


def plug_in() -> None:
    import app.engines as engines

    plugin = simulated_device.plugin()
    if plugin is not None and hasattr(engines, "register"):
        engines.register(plugin)
    else:  # a checkout from before backend plug-ins: its registry makes WORKERS engines from ENGINES
        engines.ENGINES[simulated_device.KEY] = simulated_device.SimulatedTpuEngine
        import app.registry as registry
        if hasattr(registry, "ENGINES"):
            registry.ENGINES[simulated_device.KEY] = simulated_device.SimulatedTpuEngine


def main() -> int:
    plug_in()
    if os.environ.get("BENCH_STAGES") == "1":
        instrument()
    signal.signal(signal.SIGUSR1, _dump_stats)
    from app.__main__ import main as serve

    return serve()


if __name__ == "__main__":
    sys.exit(main())
