"""app/pool/pipeline.py: a segmented model served as a pipeline of K interpreters.

The Pipeline itself with stage TEST DOUBLES (order, every tensor between segments matched by name,
bounded queues), then as the member of a pool under the pool's one watchdog (a stage that hangs is
re-created alone, in place; InvokeTimeout without a watchdog); then the real service over a loopback socket on segmented copies of the committed
models (python -m converter segment), whose output bytes and top-5 must equal the whole
model's on `cpu` and `emulated`; a lost device inside a served pipeline; segment i on TPU i
through the libedgetpu TEST DOUBLE; and bench/pipeline_capacity.py run briefly.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time

import httpx
import numpy as np
import pytest

from app.engines import Backend, EngineOptions, TensorSpec, register, unregister
from app.errors import Busy, DeviceHung, EngineLoadError, InvokeTimeout
from app.model_dir.reading import read_model_dir
from app.pool.pipeline import Pipeline, stage_options
from app.pool import EnginePool, Stage, Watchdog
from app.settings import Settings
from bench import pipeline_capacity as capacity_bench
from bench.service import ServiceProcess
from converter.segment import segment_model_dir
from tests.conftest import MODELS
from tests.doubles.libedgetpu import libedgetpu_double  # noqa: F401 (a fixture: the libedgetpu TEST DOUBLE)
from tests.pool_requests import run_in
from tests.thread_nice import linux_only, this_thread
from tests.waiting import turns_until

EVENTUALLY_S = 10
HANG_S = 0.3


class StageDouble:
    """TEST DOUBLE of one segment's interpreter: adds `step` to its input, records what it saw;
    hangs while `hang` is set (a device that stops answering); takes `pause_s` per invoke (a slow segment)."""

    def __init__(self, step: int, seen: list, hang: threading.Event | None = None, pause_s: float = 0.0):
        self.inputs = (TensorSpec("in", (1, 4), np.dtype(np.int32), 0.0, 0),)
        self.outputs = (TensorSpec("in", (1, 4), np.dtype(np.int32), 0.0, 0),)  # the next segment's "in"
        self.step, self.seen, self.hang, self.pause_s = step, seen, hang, pause_s
        self.released = threading.Event()
        self.closed = threading.Event()

    def run(self, inputs):
        (x,) = inputs
        self.seen.append(int(x[0, 0]))
        if self.hang is not None and self.hang.is_set():
            self.hang.clear()
            self.released.wait(EVENTUALLY_S)
        if self.pause_s:
            time.sleep(self.pause_s)  # simulates the segment's work: an invoke that takes time
        return [x + self.step]

    def close(self):
        self.closed.set()


def pipeline_of(doubles) -> Pipeline:
    return Pipeline("m/test", [Stage(d, device=f"tpu{i}", index=i) for i, d in enumerate(doubles)])


def watched_pool(pipeline: Pipeline, reload=None, hang_s=HANG_S, watched=True) -> EnginePool:
    """The pipeline as the one member of a pool, under the pool's watchdog (or without one: InvokeTimeout)."""
    watchdog = Watchdog(hang_s, reload, retry_s=0.05) if watched else None
    return EnginePool("m/test", [pipeline], max_waiting=8, wait_timeout_s=EVENTUALLY_S, retry_after_s=1,
                      watchdog=watchdog, invoke_timeout_s=hang_s)


def run(pool: EnginePool, value: int):
    """One request through the pool, from a thread of the test (each its own event loop)."""
    return asyncio.run(run_in(pool, [np.full((1, 4), value, np.int32)]))


class ThreadNotingStage(StageDouble):
    """TEST DOUBLE of a segment that also notes the thread each run ran on (its name and nice value, from /proc)."""

    def __init__(self, step: int, seen: list, hang: threading.Event | None = None):
        super().__init__(step, seen, hang)
        self.ran_on: list[tuple[str, int]] = []

    def run(self, inputs):
        self.ran_on.append(this_thread())
        return super().run(inputs)


@linux_only
def test_a_pipeline_on_the_hosts_cores_computes_below_the_loop_always_and_its_lanes_hand_nothing_over():
    """A pipeline's segments run on threads of its own, lowered for good (thread_nice): the pool's lanes, which only
    wait for them, hand no run to a thread below, overloaded or not (app/threads.py)."""
    hang, seen = threading.Event(), []
    stages = [ThreadNotingStage(1, seen, hang), ThreadNotingStage(10, seen)]
    pipeline = Pipeline("m/nice", [Stage(d, index=i) for i, d in enumerate(stages)], lanes_per_segment=1,
                        thread_nice=5)
    pool = EnginePool("m/nice", [pipeline], max_waiting=0, wait_timeout_s=EVENTUALLY_S, retry_after_s=1,
                      invoke_timeout_s=EVENTUALLY_S, thread_nice=5)

    async def scenario():
        hang.set()
        held = [asyncio.ensure_future(run_in(pool, [np.full((1, 4), i, np.int32)])) for i in (0, 100)]
        await turns_until(lambda: pool.line.admitted == 2, "both lanes' places taken")
        with pytest.raises(Busy):
            pool.admit()  # the line overflows: overloaded
        assert pool.line.overloaded
        stages[0].released.set()
        assert sorted(int(r.outputs[0][0, 0]) for r in await asyncio.gather(*held)) == [11, 111]
        assert int((await run_in(pool, [np.full((1, 4), 200, np.int32)])).outputs[0][0, 0]) == 211

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    lowered = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    assert [nice for stage in stages for _, nice in stage.ran_on] == [lowered] * 6
    assert not any(name.endswith("-below") for stage in stages for name, _ in stage.ran_on)
    assert not any(thread.name.endswith("-below") for thread in threading.enumerate())


def test_requests_flow_through_every_segment_in_order():
    seen = [[], [], []]
    pipeline = pipeline_of([StageDouble(1, seen[0]), StageDouble(10, seen[1]), StageDouble(100, seen[2])])
    outputs = {}

    def client(i):
        outputs[i] = pipeline.invoke([np.full((1, 4), i * 1000, np.int32)])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(EVENTUALLY_S)
    assert all(int(outputs[i][0][0][0, 0]) == i * 1000 + 111 for i in range(24))
    assert all(len(outputs[i][1]) == 3 for i in range(24))
    # every stage saw the requests in the same order: none overtakes another inside the pipeline
    assert seen[1] == [v + 1 for v in seen[0]] and seen[2] == [v + 11 for v in seen[0]]
    pipeline.close()


class TwoTensorStage:
    """TEST DOUBLE of a segment that takes and gives two tensors, `a` and `b`, listed in the given orders."""

    def __init__(self, inputs_order: str, outputs_order: str, last: bool = False):
        def spec(name):
            return TensorSpec(name, (1, 2), np.dtype(np.int32), 0.0, 0)
        self.inputs = tuple(spec(n) for n in inputs_order)
        self.outputs = tuple(spec(n + ("_out" if last else "")) for n in outputs_order)
        self.outputs_order = outputs_order

    def run(self, inputs):
        by_name = {spec.name: x for spec, x in zip(self.inputs, inputs)}
        a, b = by_name["a"], by_name["b"]
        made = {"a": a + 1, "b": b * 10}
        return [made[n] for n in self.outputs_order]

    def close(self):
        pass


def test_every_tensor_between_segments_goes_to_the_input_of_its_name_whatever_the_order():
    """Segment 0 gives (b, a), segment 1 takes (a, b): matched by name at load, not by position."""
    pipeline = Pipeline("m/two", [Stage(TwoTensorStage("ab", "ba"), index=0),
                                  Stage(TwoTensorStage("ab", "ab", last=True), index=1)])
    try:
        outputs, segments_ms = pipeline.invoke([np.array([[1, 2]], np.int32), np.array([[3, 4]], np.int32)])
        assert [o.tolist() for o in outputs] == [[[3, 4]], [[300, 400]]] and len(segments_ms) == 2
        assert [s.name for s in pipeline.outputs] == ["a_out", "b_out"]
    finally:
        pipeline.close()


def test_segments_whose_tensors_do_not_meet_are_refused_at_load():
    class Gives(TwoTensorStage):
        def __init__(self, names):
            super().__init__("ab", "ab")
            self.outputs = tuple(TensorSpec(n, (1, 2), np.dtype(np.int32), 0.0, 0) for n in names)

    with pytest.raises(EngineLoadError, match=r"segment 1 takes tensor 'b', which segment 0 does not give"):
        Pipeline("m/x", [Stage(Gives("ac"), index=0), Stage(TwoTensorStage("ab", "ab"), index=1)])
    with pytest.raises(EngineLoadError, match=r"segment 0 gives \['c'\], which segment 1 does not take"):
        Pipeline("m/x", [Stage(Gives("abc"), index=0), Stage(TwoTensorStage("ab", "ab"), index=1)])


def test_the_queues_between_stages_are_bounded():
    """A slow last segment holds the others back: at most one input waits in front of it."""
    depth = []
    seen = [[], []]
    pipeline = pipeline_of([StageDouble(1, seen[0]), StageDouble(1, seen[1], pause_s=0.01)])
    original = pipeline._queues[1].put

    def put(item, *args, **kwargs):
        original(item, *args, **kwargs)
        depth.append(pipeline._queues[1].qsize())

    pipeline._queues[1].put = put
    threads = [threading.Thread(target=pipeline.invoke, args=([np.zeros((1, 4), np.int32)],))
               for _ in range(pipeline.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(EVENTUALLY_S)
    assert len(seen[1]) == pipeline.lanes and max(depth) <= 1
    pipeline.close()


# ---- the pipeline as a member of its pool, under the pool's one watchdog -----------------------

def test_a_hung_segment_fails_its_requests_and_is_re_created_alone():
    hang = threading.Event()
    seen = [[], []]
    first, hung = StageDouble(1, seen[0]), StageDouble(1, seen[1], hang)
    created = []

    def reload(old: Stage) -> Stage:
        fresh = StageDouble(1, seen[1])
        created.append((old.index, fresh))
        return Stage(fresh, device=old.device, index=old.index)

    pipeline = pipeline_of([first, hung])
    pool = watched_pool(pipeline, reload)
    try:
        assert int(run(pool, 0).outputs[0][0, 0]) == 2
        hang.set()
        start = time.monotonic()
        with pytest.raises(DeviceHung, match=r"segment 1 on tpu1 did not finish an invoke within 0.3 s") as lost:
            run(pool, 0)
        assert HANG_S <= time.monotonic() - start < HANG_S + 2 and lost.value.retry_after_s == 1
        assert pool.wait_until(lambda: not pool.members.unhealthy, EVENTUALLY_S)
        assert [index for index, _ in created] == [1]  # that segment alone, on its device
        assert pool.members == [pipeline] and pipeline.stages[0].engine is first  # repaired in place
        assert int(run(pool, 5).outputs[0][0, 0]) == 7  # served by the new stage
        assert not hung.closed.is_set()
        hung.released.set()  # the hung invoke returns at last: its thread closes its interpreter and ends
        assert hung.closed.wait(EVENTUALLY_S)
    finally:
        pool.close()


def test_every_request_in_the_pipeline_fails_when_a_segment_is_lost():
    """One in the hung stage, one queued before it, one in the stage before, blocked handing on."""
    hang, never = threading.Event(), threading.Event()
    seen = [[], []]

    def reload(old):  # the device stays lost while the test looks
        never.wait(EVENTUALLY_S)
        raise RuntimeError("device not listed")

    pipeline = pipeline_of([StageDouble(1, seen[0]), StageDouble(1, seen[1], hang)])
    pool = watched_pool(pipeline, reload)
    hang.set()
    errors = []

    def client():
        try:
            run(pool, 0)
        except DeviceHung as e:
            errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(EVENTUALLY_S)
    assert len(errors) == 3 and len(seen[0]) == 3 and len(seen[1]) == 1
    assert all("segment 1 on tpu1" in str(e) for e in errors)
    never.set()
    pipeline.stages[1].engine.released.set()
    pool.close()


def test_while_a_segment_is_being_re_created_requests_are_refused_at_once():
    gate = threading.Event()
    hang = threading.Event()

    def reload(old: Stage) -> Stage:
        gate.wait(EVENTUALLY_S)
        return Stage(StageDouble(1, []), device=old.device, index=old.index)

    pipeline = pipeline_of([StageDouble(1, [], hang)])
    pool = watched_pool(pipeline, reload)
    hang.set()
    with pytest.raises(DeviceHung):
        run(pool, 0)
    start = time.monotonic()
    with pytest.raises(DeviceHung, match="every device is unhealthy.*segment 0 on tpu0 did not finish"):
        run(pool, 0)
    assert time.monotonic() - start < HANG_S  # refused, not waited for
    assert pool.members[0].problem.startswith("segment 0 on tpu0")
    gate.set()
    assert pool.wait_until(lambda: not pool.members.unhealthy, EVENTUALLY_S)
    assert int(run(pool, 1).outputs[0][0, 0]) == 2
    pool.close()


def test_invoke_timeout_is_the_error_where_no_watchdog_applies():
    """As for any member: the request gets a 504, nothing is taken out or re-created, and the pipeline
    serves again once the slow invoke ends."""
    hang = threading.Event()
    slow = StageDouble(1, [], hang)
    pipeline = pipeline_of([slow])
    pool = watched_pool(pipeline, watched=False)
    hang.set()
    with pytest.raises(InvokeTimeout):
        run(pool, 0)
    assert not pool.members.unhealthy
    slow.released.set()
    assert int(run(pool, 1).outputs[0][0, 0]) == 2
    pool.close()


def test_a_device_backend_needs_one_device_per_segment():
    class TwoDevices(Backend):
        key = "twodevices"
        host_cpu = False

        def interpreters(self):
            return [EngineOptions()] * 2

    with pytest.raises(EngineLoadError, match=r"a model in 3 segments needs 3 devices, 2 found"):
        stage_options(TwoDevices(Settings()), 3)
    assert len(stage_options(TwoDevices(Settings()), 2)) == 2


# ---- served: the real models, segmented, over HTTP ------------------------------------------

REAL = ("efficientnet_lite0", "mobilenet_v2")


@pytest.fixture(scope="module")
def segmented_models(tmp_path_factory):
    """The two real models whole, and each cut into 2 and 3 segments, in one models directory."""
    import shutil

    root = tmp_path_factory.mktemp("models")
    for name in REAL:
        shutil.copytree(MODELS / name, root / name)
        for k in (2, 3):
            segment_model_dir(root / name, root / f"{name}_x{k}", k)
    return root


def _tensor(model_dir, photo) -> np.ndarray:
    from app.imaging import prepare
    from app.imaging.quantization import InputQuantizer

    spec = model_dir.manifest.input
    q = model_dir.manifest.quantization.input
    return InputQuantizer(spec, np.dtype(q.dtype), q.scale, q.zero_point)(prepare(photo.read_bytes(), spec, 50_000_000))


def _compare_served(url: str, backend: str, root, photos) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for name in REAL:
            model_dir = read_model_dir(root / name)
            for photo in photos:
                tensor = _tensor(model_dir, photo)
                answers = {}
                for served in (name, f"{name}_x2", f"{name}_x3"):
                    raw = client.post(f"/v2/models/{served}/infer", json={
                        "inputs": [{"name": "image", "shape": list(tensor.shape),
                                    "datatype": "UINT8" if tensor.dtype == np.uint8 else "INT8",
                                    "data": tensor.reshape(-1).tolist()}],
                        "outputs": [{"name": "raw"}], "parameters": {"backend": backend}})
                    assert raw.status_code == 200, raw.text
                    top5 = client.post(f"/v1/models/{served}/classify?top_k=5&backend={backend}",
                                       content=photo.read_bytes(), headers={"Content-Type": "image/png"})
                    assert top5.status_code == 200, top5.text
                    body = top5.json()
                    if served != name:
                        segments = body["timing_ms"]["segments"]
                        assert len(segments) == int(served[-1]) and all(ms > 0 for ms in segments)
                    answers[served] = (raw.json()["outputs"][0]["data"], body["predictions"])
                whole = answers[name]
                for served, answer in answers.items():
                    assert answer[0] == whole[0], f"{served} on {backend}: output bytes differ from {name}'s"
                    assert [p["index"] for p in answer[1]] == [p["index"] for p in whole[1]]
                    assert [p["score"] for p in answer[1]] == [p["score"] for p in whole[1]]


def _service(root, backends: str) -> ServiceProcess:
    svc = ServiceProcess({"EDGETPU_SERVE_MODEL_DIR": str(root), "EDGETPU_SERVE_BACKENDS": backends,
                          "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_WARMUP_AT_START": "false",
                          "EDGETPU_SERVE_MODELS": ""}, inherit_settings=False)
    svc.wait_ready()
    return svc


def test_segmented_models_served_on_cpu_answer_the_whole_models_bytes(segmented_models, cat_png):
    svc = _service(segmented_models, "cpu")
    try:
        _compare_served(svc.url, "cpu", segmented_models, [cat_png])
        described = httpx.get(f"{svc.url}/v1/models/efficientnet_lite0_x3", timeout=30).json()
        assert len(described["segments"]["items"]) == 3 and described["backends"]["cpu"]["interpreters"] == 3
        assert httpx.get(f"{svc.url}/v1/models/efficientnet_lite0", timeout=30).json().get("segments") is None
        metrics = httpx.get(f"{svc.url}/metrics", timeout=30).text
        assert 'edgetpu_serve_segment_seconds_count{backend="cpu",model="mobilenet_v2_x3",segment="2"}' in metrics
    finally:
        svc.stop()


@pytest.mark.slow
def test_segmented_models_served_emulated_answer_the_whole_models_bytes(segmented_models, cat_png, coffee_png):
    svc = _service(segmented_models, "emulated")
    try:
        _compare_served(svc.url, "emulated", segmented_models, [cat_png, coffee_png])
    finally:
        svc.stop()


# ---- a lost device inside a served pipeline ------------------------------------------------------

class SegmentDeviceDouble:
    """TEST DOUBLE of a TPU running one segment: passes its input on (resized to its output), hangs
    once when told. Loaded from the real segment files, so the pipeline's shapes are the model's."""

    key = "segtpu"
    model_file = "int8"
    hang_path: str | None = None
    gate = threading.Event()  # a hung invoke waits on it
    loads: list[str] = []
    reloads = threading.Event()  # while clear, loading a segment again (the watchdog's) waits: the device resets

    def __init__(self, path):
        from app.tflite_file import read_tflite

        graph = read_tflite(path).graph
        self.inputs, self.outputs = (tuple(TensorSpec(t.name, t.shape, t.dtype, float(t.quantization.scale[0]),
                                                      int(t.quantization.zero_point[0]))
                                           for t in (graph.tensors[i] for i in indices))
                                     for indices in (graph.inputs, graph.outputs))
        self.path = str(path)

    @classmethod
    def load(cls, path, options):
        if str(path) in cls.loads:
            cls.reloads.wait(EVENTUALLY_S)
        cls.loads.append(str(path))
        return cls(path)

    def run(self, inputs):
        if SegmentDeviceDouble.hang_path == self.path:
            SegmentDeviceDouble.hang_path = None
            SegmentDeviceDouble.gate.wait(EVENTUALLY_S)
        return [np.zeros(spec.shape, spec.dtype) for spec in self.outputs]

    def close(self):
        pass


class SegmentDevicesDouble(Backend):
    """TEST DOUBLE plug-in: one SegmentDeviceDouble per 'device', three devices."""

    key = SegmentDeviceDouble.key
    engine = SegmentDeviceDouble
    host_cpu = False

    def interpreters(self):
        return [EngineOptions()] * 3

    def device(self, options):
        return "segtpu"


def test_a_pipelines_lanes_and_queues_are_its_settings(segmented_models):
    from app.registry import Registry
    from app.settings import Settings

    registry = Registry(Settings(model_dir=segmented_models, models=["efficientnet_lite0_x3"], backends=["cpu"],
                                 warmup_at_start=False, pipeline_lanes_per_segment=3, pipeline_queue_depth=2))
    registry.configure()
    registry.load_all()
    try:
        (pipeline,) = registry.get("efficientnet_lite0_x3").pool("cpu").members
        assert pipeline.lanes == 3 * 3 and [q.maxsize for q in pipeline._queues[1:]] == [2, 2]
    finally:
        registry.close()


def test_a_device_lost_mid_pipeline_gives_503_and_the_pipeline_recovers(segmented_models):
    from app.registry import Registry
    from app.settings import Settings

    register(SegmentDevicesDouble)
    SegmentDeviceDouble.reloads.clear()
    try:
        settings = Settings(model_dir=segmented_models, models=["efficientnet_lite0_x3"], backends=["segtpu"],
                            warmup_at_start=False, watchdog_backends=["segtpu"], watchdog_timeout_s=HANG_S,
                            watchdog_retry_s=0.05)
        registry = Registry(settings)
        registry.configure()
        registry.load_all()
        middle = str(read_model_dir(segmented_models / "efficientnet_lite0_x3").segment_files("int8")[1])
        x = np.zeros((1, 224, 224, 3), np.uint8)

        async def infer():
            async with registry.ticket("efficientnet_lite0_x3") as ticket:
                return await ticket.run(x)

        async def scenario():
            first = await infer()
            SegmentDeviceDouble.hang_path = middle
            with pytest.raises(DeviceHung, match="segment 1 on segtpu did not finish an invoke") as lost:
                await infer()
            status = registry.status("efficientnet_lite0_x3")  # readiness says so while it is re-created
            assert status.state == "unhealthy" and "segment 1 on segtpu" in status.error and not registry.ready()
            SegmentDeviceDouble.reloads.set()
            pool = registry.get("efficientnet_lite0_x3").pool("segtpu")
            assert await asyncio.to_thread(pool.wait_until, lambda: not pool.members.unhealthy, EVENTUALLY_S)
            assert registry.status("efficientnet_lite0_x3").state == "ready" and registry.ready()
            return first, lost.value, await infer()

        loads_before = len(SegmentDeviceDouble.loads)
        first, error, after = asyncio.run(scenario())
        assert first.segments_ms is not None and len(first.segments_ms) == 3
        assert after.outputs[0].shape == (1, 1000) and len(after.segments_ms) == 3
        assert SegmentDeviceDouble.loads[loads_before:] == [middle]  # that segment alone re-created
        from app.api.errors import status_of

        assert status_of(error) == 503
    finally:
        SegmentDeviceDouble.gate.set()
        SegmentDeviceDouble.reloads.set()
        registry.close()
        unregister(SegmentDevicesDouble.key)


# ---- edgetpu: segment i on TPU i (the libedgetpu TEST DOUBLE; segments "compiled" as their plain files) ----

def test_on_edgetpu_segment_i_runs_on_tpu_i(tmp_path, segmented_models, libedgetpu_double, monkeypatch):
    """The delegate wiring is real, the TPUs are not: the libedgetpu double lists three PCIe TPUs and
    its delegate takes what it can; each plain segment file is listed as its compiled one."""
    import shutil

    from app.model_dir.schema import segment_kind
    from app.registry import Registry
    from app.settings import Settings
    from converter.model_dir import add_files
    from tests.doubles.libedgetpu import DEVICES, log_delegates

    nodes = []
    for i in range(3):
        nodes.append(tmp_path / f"apex_{i}")
        nodes[-1].write_bytes(b"")
    monkeypatch.setenv(DEVICES, ",".join(f"pci:{n}" for n in nodes))
    log_delegates(monkeypatch, tmp_path / "log")
    root = tmp_path / "models"
    shutil.copytree(segmented_models / "efficientnet_lite0_x3", root / "efficientnet_lite0_x3")
    model = read_model_dir(root / "efficientnet_lite0_x3")
    add_files(model.path, {segment_kind("edgetpu", i): (p.name.replace(".tflite", "_edgetpu.tflite"), p.read_bytes())
                           for i, p in enumerate(model.segment_files("int8"))})
    registry = Registry(Settings(model_dir=root, backends=["edgetpu"], warmup_at_start=False, plugins={"edgetpu": {
        "library": str(libedgetpu_double), "on_failure": "fail", "version_check": "warn"}}))
    registry.configure()
    registry.load_all()
    try:
        assert registry.ready() and registry.status("efficientnet_lite0_x3").error is None
        (pipeline,) = registry.get("efficientnet_lite0_x3").pool("edgetpu").members
        assert [s.device for s in pipeline.stages] == [str(n) for n in nodes]
        assert (tmp_path / "log").read_text().splitlines() == [f"created device=:{i}" for i in range(3)]

        async def infer():
            async with registry.ticket("efficientnet_lite0_x3") as ticket:
                return await ticket.run(np.full((1, 224, 224, 3), 127, np.uint8))

        result = asyncio.run(infer())
        assert result.outputs[0].shape == (1, 1000) and len(result.segments_ms) == 3
    finally:
        registry.close()


def test_on_edgetpu_an_uncompiled_segmented_model_says_how_to_compile_it(tmp_path, segmented_models,
                                                                         libedgetpu_double, monkeypatch):
    import shutil

    from app.errors import ModelDirError
    from app.registry import Registry
    from app.settings import Settings
    from tests.doubles.libedgetpu import DEVICES

    (tmp_path / "apex_0").write_bytes(b"")
    monkeypatch.setenv(DEVICES, f"pci:{tmp_path / 'apex_0'}")
    shutil.copytree(segmented_models / "mobilenet_v2_x2", tmp_path / "models" / "mobilenet_v2_x2")
    registry = Registry(Settings(model_dir=tmp_path / "models", backends=["edgetpu"], warmup_at_start=False,
                                 plugins={"edgetpu": {"library": str(libedgetpu_double), "on_failure": "fail",
                                                      "version_check": "warn"}}))
    with pytest.raises(ModelDirError, match=r"no 'edgetpu_segment_0' file.*segment it again with --compile"):
        registry.configure()


# ---- bench/pipeline_capacity.py runs, briefly (its figures are the bench's business, not asserted) ----


def test_the_capacity_bench_prints_pipeline_against_one_device(capsys):
    capacity_bench.main(["--models", "mobilenet_v2", "--segments", "2,3", "--device-ms", "20",
                            "--duration", "0.3", "--rounds", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| mobilenet_v2 |")]
    assert len(rows) == 2
    for row, k in zip(rows, (2, 3)):
        cells = [c.strip() for c in row.strip("|").split("|")]
        segments = [float(v) for v in cells[2].split(" + ")]
        assert int(cells[1]) == k and len(segments) == k and abs(sum(segments) - 20) < 0.05
        assert int(cells[3]) == round(1000 / max(segments))          # the bound: 1 / the slowest segment
        assert float(cells[4]) > 0 and re.fullmatch(r"\d+ \(50\)", cells[6])  # whole model: bound 1/20 ms


def test_segment_times_are_the_converters_cost_shares():
    split = capacity_bench.split("efficientnet_lite0", 3, 30.0)
    model = read_model_dir(MODELS / "efficientnet_lite0")
    assert len(split.segments_ms) == 3 and abs(sum(split.segments_ms) - 30.0) < 1e-9
    assert split.specs[0][0].shape == (1, model.manifest.input.height, model.manifest.input.width, 3)
    assert split.specs[-1][1].shape == (1, 1000)
    assert all(a[1].shape == b[0].shape for a, b in zip(split.specs, split.specs[1:]))
