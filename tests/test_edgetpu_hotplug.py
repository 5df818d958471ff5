"""TPUs come and go without a restart: plugged in after start, unplugged under load, plugged back, missing
at start; the model moves between its CPU fallback and the TPU; readiness, /v1/devices and /metrics follow.

libedgetpu is the TEST DOUBLE: its list of TPUs is a file the tests rewrite (PluggedTpus), and the invokes
of a TPU that was unplugged fail, as a real one's do. In process, the probe runs on a fake clock: a test
moves it by one probe interval and waits for the round that brings (no test waits for time to pass). Over
a real socket, a bounded load loop runs while TPUs are unplugged and plugged back."""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.errors import DeviceGone
from app.model_dir.reading import read_model_dir
from app.model_dir.schema import segment_kind
from app.registry import Registry
from app.settings import Settings
from converter.model_dir import add_files
from converter.segment import segment_model_dir
from tests.conftest import DEFAULT_MODEL, MODELS, Service
from tests.doubles.apex_sysfs import fake_apex
from tests.doubles.clock import FakeClock
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import libedgetpu_double, pci_tpu, plugged_tpus  # noqa: F401
from tests.waiting import until

INTERVAL_S = 1.0
EVENTUALLY_S = 30



class Served:
    """A registry serving the default model with the Edge TPU plug-in on the double, its probe on a fake clock;
    `core`: more of the core's settings (a share of the host's TPUs, say)."""

    def __init__(self, tmp_path, library, policy="fallback", backends=("edgetpu", "cpu"), devices=(), models=None,
                 name=DEFAULT_MODEL, core=None, **edgetpu):
        self.name = name
        settings = Settings(model_dir=models or plain_as_compiled(tmp_path / "models"), backends=list(backends),
                            workers=1, **(core or {}),
                            plugins={"edgetpu": dict(library=str(library), on_failure=policy, version_check="warn",
                                                     probe_interval_s=INTERVAL_S, devices=list(devices), **edgetpu)})
        self.registry = Registry(settings)
        self.plugin = self.registry.plugins["edgetpu"]
        self.clock = FakeClock()
        self.plugin.probe_clock = self.clock
        self.registry.configure()
        self.registry.load_all()

    def one_interval(self) -> None:
        """The probe's clock one interval on; back once the round it brings (and all it set off) is done."""
        prober = self.plugin.prober
        done = prober.rounds
        self.clock.advance(INTERVAL_S)
        prober.poke()
        assert prober.wait_rounds(done + 1, EVENTUALLY_S)

    def pool(self, backend="edgetpu"):
        return self.registry.get(self.name).pool(backend)

    def status(self):
        return self.registry.status(self.name)

    def requests(self, count: int, backend: str | None = None) -> list:
        """`count` requests at once through the registry, as the core makes them: (backend, result) or the error."""

        async def one():
            async with self.registry.ticket(self.name, backend) as ticket:
                result = await ticket.run(np.full(ticket.input.shape, 127, np.uint8))
                return ticket.backend, result

        async def all_of_them():
            return await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)

        return asyncio.run(all_of_them())

    def close(self):
        self.registry.close()


def devices_of(pool) -> list[tuple[str, bool]]:
    return [(m.device, m.healthy) for m in pool.members]


def test_a_tpu_plugged_in_after_start_serves_within_one_probe_interval(tmp_path, plugged_tpus, libedgetpu_double):
    """Fewer TPUs than EDGETPU_DEVICES names at start: it serves on those there (even with `fail`), and takes
    the other into service, loaded and warmed up, at the next probe round."""
    a, b = pci_tpu(tmp_path, 0), pci_tpu(tmp_path, 1)
    plugged_tpus.plug(a)
    served = Served(tmp_path, libedgetpu_double, policy="fail", devices=["pci:0", "pci:1"])
    try:
        assert served.registry.ready() and served.plugin.inventory.waiting_for == ["pci:1"]
        assert devices_of(served.pool()) == [(str(tmp_path / "apex_0"), True)]
        plugged_tpus.plug(b)
        served.one_interval()
        pool = served.pool()
        assert devices_of(pool) == [(str(tmp_path / "apex_0"), True), (str(tmp_path / "apex_1"), True)]
        assert pool.members[1].first_inference_ms > 0  # warmed up before it joined
        answers = served.requests(4)
        assert all(not isinstance(a, Exception) and a[0] == "edgetpu" for a in answers), answers
        assert served.status().state == "ready" and served.registry.get(DEFAULT_MODEL).number == 1  # no reload
        assert served.plugin.inventory.counts.changes == {"joined": 2, "left": 0}
    finally:
        served.close()


def test_a_model_on_its_cpu_fallback_at_start_moves_to_the_tpu_once_one_is_plugged_in(
        tmp_path, plugged_tpus, libedgetpu_double):
    served = Served(tmp_path, libedgetpu_double)
    try:
        status = served.status()
        assert status.state == "degraded" and "no Edge TPU found" in status.error
        assert "listed again every 1 s" in status.error and served.registry.default_backend == "cpu"
        assert [a[0] for a in served.requests(2)] == ["cpu", "cpu"]
        plugged_tpus.plug(pci_tpu(tmp_path, 0))
        served.one_interval()
        version = served.registry.get(DEFAULT_MODEL)
        assert version.number == 2 and sorted(version.pools) == ["cpu", "edgetpu"] and not version.fallbacks
        assert served.status().state == "ready" and served.status().error is None
        assert served.registry.default_backend == "edgetpu"
        assert version.pool("edgetpu").members[0].first_inference_ms > 0  # warmed up before it served
        assert [a[0] for a in served.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        served.close()


def test_an_unplugged_tpu_leaves_its_requests_to_the_other_and_serves_again_once_back(
        tmp_path, plugged_tpus, libedgetpu_double):
    a, b = pci_tpu(tmp_path, 0), pci_tpu(tmp_path, 1)
    plugged_tpus.plug(a, b)
    served = Served(tmp_path, libedgetpu_double)
    try:
        pool = served.pool()
        plugged_tpus.unplug(a)
        answers = served.requests(8)  # some reach the unplugged TPU first: they are answered by the other
        assert all(not isinstance(x, Exception) and x[0] == "edgetpu" for x in answers), answers
        served.one_interval()
        assert served.pool() is pool and devices_of(pool) == [(str(tmp_path / "apex_0"), False),
                                                               (str(tmp_path / "apex_1"), True)]
        status = served.status()
        assert status.state == "degraded" and "apex_0 not listed any more" in status.error
        report = {d["path"]: d for d in served.plugin.report(served.registry.members("edgetpu"))["devices"]}
        assert report[str(tmp_path / "apex_0")]["health"] == "missing"
        assert report[str(tmp_path / "apex_0")]["index"] is None
        assert report[str(tmp_path / "apex_1")]["health"] == "healthy"
        plugged_tpus.plug(a)
        served.one_interval()
        assert devices_of(pool) == [(str(tmp_path / "apex_0"), True), (str(tmp_path / "apex_1"), True)]
        assert served.status().state == "ready" and pool.members[0].first_inference_ms > 0
        counts = served.plugin.inventory.counts
        assert counts.changes == {"joined": 3, "left": 1} and counts.probes["changed"] >= 2
    finally:
        served.close()


def test_the_last_tpu_unplugged_moves_the_model_to_its_fallback_and_back(tmp_path, plugged_tpus, libedgetpu_double):
    a = pci_tpu(tmp_path, 0)
    plugged_tpus.plug(a)
    served = Served(tmp_path, libedgetpu_double)
    try:
        assert served.registry.default_backend == "edgetpu"
        plugged_tpus.unplug(a)
        answers = served.requests(6)  # the first finds the TPU gone and wakes the probe: none is lost
        assert all(not isinstance(x, Exception) and x[0] == "cpu" for x in answers), answers
        version = served.registry.get(DEFAULT_MODEL)
        assert list(version.pools) == ["cpu"] and served.registry.default_backend == "cpu"
        status = served.status()
        assert status.state == "degraded" and "edgetpu requested, serving on cpu: every edgetpu device" in status.error
        plugged_tpus.plug(a)
        served.one_interval()
        assert served.registry.default_backend == "edgetpu" and served.status().state == "ready"
        assert [x[0] for x in served.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        served.close()


def test_without_a_fallback_the_last_tpu_unplugged_gets_503s_until_it_is_back(
        tmp_path, plugged_tpus, libedgetpu_double):
    a = pci_tpu(tmp_path, 0)
    plugged_tpus.plug(a)
    served = Served(tmp_path, libedgetpu_double, policy="fail", backends=("edgetpu",))
    try:
        plugged_tpus.unplug(a)
        served.one_interval()
        answers = served.requests(3)
        assert all(isinstance(x, DeviceGone) and x.status == 503 and x.retry_after_s == 1 for x in answers), answers
        status = served.status()
        assert status.state == "unhealthy" and not served.registry.ready() and "not listed any more" in status.error
        plugged_tpus.plug(a)
        served.one_interval()
        assert served.registry.ready() and [x[0] for x in served.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        served.close()


def test_the_probe_is_counted_on_metrics_and_shown_on_devices(tmp_path, plugged_tpus, libedgetpu_double):
    served = Served(tmp_path, libedgetpu_double)
    try:
        served.one_interval()  # nothing there
        plugged_tpus.plug(pci_tpu(tmp_path, 0))
        served.one_interval()  # one joins
        samples = {(s.name, tuple(s.labels.items())): s.value
                   for family in served.plugin.collect(served.registry.members("edgetpu")) for s in family.samples}
        prefix = "edgetpu_serve_edgetpu"
        assert samples[(f"{prefix}_probes_total", (("result", "unchanged"),))] == 2  # the start's listing too
        assert samples[(f"{prefix}_probes_total", (("result", "changed"),))] == 1
        assert samples[(f"{prefix}_device_changes_total", (("change", "joined"),))] == 1
        assert samples[(f"{prefix}_devices", ())] == samples[(f"{prefix}_devices_listed", ())] == 1
        probe = served.plugin.report(served.registry.members("edgetpu"))["probe"]
        assert probe["interval_s"] == INTERVAL_S and probe["running"] and probe["in_service"] == 1
        assert probe["probes"]["changed"] == 1 and probe["last_probe"].endswith("Z")
    finally:
        served.close()
    assert served.plugin.prober.stopped  # the registry's close stops the probe


def test_each_probe_round_reads_the_temperature_so_a_hot_tpu_is_logged_unasked(
        tmp_path, plugged_tpus, libedgetpu_double, caplog):
    node = tmp_path / "apex_0"
    plugged_tpus.plug(f"pci:{node}")
    sysfs = tmp_path / "sys"
    fake_apex(sysfs, "apex_0", 52000)
    served = Served(tmp_path, libedgetpu_double, apex_sysfs_dir=sysfs)
    try:
        caplog.set_level(logging.WARNING, logger="app.edgetpu.temperature")
        fake_apex(sysfs, "apex_0", 86000)
        served.one_interval()  # no /readyz, /metrics or /v1/devices asked: the probe read it
        assert [r.getMessage() for r in caplog.records if r.name == "app.edgetpu.temperature"] == [
            f"Edge TPU {served.plugin.temperatures.hot()['apex_0']}"]
    finally:
        served.close()


def segmented_as_compiled(root: Path, segments: int) -> str:
    """The default model cut into `segments` (python -m converter segment's own function), each plain segment
    listed as its compiled file too, as for the whole model; its name."""
    whole = root / "whole"
    shutil.copytree(MODELS / DEFAULT_MODEL, whole / DEFAULT_MODEL)
    name = f"{DEFAULT_MODEL}_x{segments}"
    segment_model_dir(whole / DEFAULT_MODEL, root / "models" / name, segments)
    model = read_model_dir(root / "models" / name)
    add_files(model.path, {segment_kind("edgetpu", i): (p.name.replace(".tflite", "_edgetpu.tflite"), p.read_bytes())
                           for i, p in enumerate(model.segment_files("int8"))})
    return name


def test_a_segmented_model_moves_to_its_tpus_once_it_has_one_per_segment_and_off_them_when_one_leaves(
        tmp_path, plugged_tpus, libedgetpu_double):
    name = segmented_as_compiled(tmp_path, 3)
    a, b, c = (pci_tpu(tmp_path, i) for i in range(3))
    plugged_tpus.plug(a, b)
    served = Served(tmp_path, libedgetpu_double, models=tmp_path / "models", name=name)
    try:
        status = served.status()
        assert status.state == "degraded" and "cut into 3 segments, one per TPU, and 2 TPU(s)" in status.error
        plugged_tpus.plug(c)
        served.one_interval()
        (pipeline,) = served.pool().members
        assert [s.device for s in pipeline.stages] == [str(tmp_path / f"apex_{i}") for i in range(3)]
        assert served.status().state == "ready" and [x[0] for x in served.requests(2)] == ["edgetpu", "edgetpu"]
        plugged_tpus.unplug(b)
        # The double's delegate takes nothing of a middle segment (no uint8/int8 QUANTIZE there), so no invoke
        # fails: the probe finds the TPU gone (the pool's own path, an invoke failing, is test_pool_membership's)
        served.one_interval()
        assert served.status().error.startswith("edgetpu requested, serving on cpu: every edgetpu device")
        answers = served.requests(4)
        assert all(not isinstance(x, Exception) and x[0] == "cpu" for x in answers), answers
        plugged_tpus.plug(b)
        served.one_interval()
        assert served.status().state == "ready" and [x[0] for x in served.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        served.close()


# -- over a real socket, under load -----------------------------------------------------------------

CLIENTS = 4
REQUESTS_EACH = 40


class LoadLoop:
    """CLIENTS threads each sending REQUESTS_EACH classifications in turn (a bounded loop), every answer kept;
    `reached(n)` waits until n answers are in, so a test acts while requests are in flight."""

    def __init__(self, url: str, image: bytes):
        self.url, self.image = url, image
        self.answers: list[tuple[int, str | None, str | None]] = []  # status, backend, Retry-After
        self._changed = threading.Condition()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _client(self):
        with httpx.Client(base_url=self.url, timeout=60) as client:
            for _ in range(REQUESTS_EACH):
                try:
                    r = client.post("/v1/classify", files={"image": self.image})
                    answer = (r.status_code, r.json().get("backend"), r.headers.get("retry-after"))
                except httpx.HTTPError as e:  # a request lost: no answer at all
                    answer = (0, type(e).__name__, None)
                with self._changed:
                    self.answers.append(answer)
                    self._changed.notify_all()

    def reached(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.answers) >= count, EVENTUALLY_S), len(self.answers)

    def finish(self) -> list[tuple[int, str | None, str | None]]:
        for thread in self.threads:
            thread.join(EVENTUALLY_S * 4)
        assert not any(t.is_alive() for t in self.threads)
        return self.answers


def hotplug_service(tmp_path, plugged_tpus, library, policy: str, backends: str) -> Service:
    return Service({
        "EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(tmp_path / "models")),
        # one process and its pools (several processes on these TPUs: tests/test_processes.py)
        "EDGETPU_SERVE_PROCESSES": "1",
        "EDGETPU_SERVE_BACKENDS": backends, "EDGETPU_SERVE_WORKERS": "1",
        "EDGETPU_SERVE_EDGETPU_LIBRARY": str(library), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
        "EDGETPU_SERVE_EDGETPU_ON_FAILURE": policy, "EDGETPU_SERVE_EDGETPU_PROBE_INTERVAL_S": "0.2",
        **plugged_tpus.env(),
    })


def wait_until(client: httpx.Client, condition, what: str) -> dict:
    """GET /v1/models until condition(answer) holds: a condition, bounded, not a time window."""
    def answer() -> dict | None:
        models = client.get("/v1/models").json()
        return models if condition(models) else None
    return until(answer, EVENTUALLY_S, what, poll_s=0.05)


def metric(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_over_a_socket_tpus_unplugged_and_plugged_back_under_load_lose_no_request(
        tmp_path, plugged_tpus, libedgetpu_double, cat_png):
    """Two TPUs and the CPU fallback (the images' settings): one TPU unplugged, then the other, then one
    plugged back, each while requests are in flight. Every request is answered 200: by a TPU, then by the
    CPU, then by the TPU again; /readyz and /v1/devices follow; the probe's metrics count it all."""
    a, b = pci_tpu(tmp_path, 0), pci_tpu(tmp_path, 1)
    plugged_tpus.plug(a, b)
    service = hotplug_service(tmp_path, plugged_tpus, libedgetpu_double, "fallback", "edgetpu,cpu")
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            load = LoadLoop(service.url, cat_png.read_bytes())
            load.reached(20)
            plugged_tpus.unplug(a)
            load.reached(50)
            degraded = client.get("/readyz").json()["models"][DEFAULT_MODEL]
            plugged_tpus.unplug(b)  # the last TPU: the model moves to the CPU
            on_cpu = wait_until(client, lambda m: list(m["models"][0]["backends"]) == ["cpu"],
                                "the model's version on the CPU")["models"][0]
            load.reached(100)
            plugged_tpus.plug(a)  # back: the model moves to the TPU again
            wait_until(client, lambda m: m["default_backend"] == "edgetpu", "back on the TPU")
            answers = load.finish()
            ready = client.get("/readyz")
            devices = client.get("/v1/devices").json()["backends"]["edgetpu"]
            after = client.post("/v1/classify", files={"image": cat_png.read_bytes()}).json()
            metrics = client.get("/metrics").text
    finally:
        log = service.stop()
    assert len(answers) == CLIENTS * REQUESTS_EACH
    statuses = Counter(status for status, _, _ in answers)
    assert statuses == {200: CLIENTS * REQUESTS_EACH}, (statuses, log[-4000:])
    backends = [backend for _, backend, _ in answers]
    assert backends[0] == "edgetpu" and "cpu" in backends
    assert degraded["state"] == "degraded" and "apex_0 not listed any more" in degraded["error"], degraded
    assert on_cpu["state"] == "degraded" and on_cpu["error"].startswith("edgetpu requested, serving on cpu: ")
    assert ready.status_code == 200 and ready.json()["models"][DEFAULT_MODEL]["state"] == "ready"
    assert after["backend"] == "edgetpu" and after["predictions"][0]["label"] == "tiger cat"
    listed = {d["path"]: d for d in devices["devices"]}
    assert listed[str(tmp_path / "apex_0")]["health"] == "healthy" and str(tmp_path / "apex_1") not in listed
    assert devices["probe"]["changes"] == {"joined": 3, "left": 2} and devices["probe"]["in_service"] == 1
    assert metric(metrics, "edgetpu_serve_edgetpu_device_changes_total", change="left") == 2
    assert metric(metrics, "edgetpu_serve_edgetpu_device_changes_total", change="joined") == 3
    assert metric(metrics, "edgetpu_serve_edgetpu_probes_total", result="changed") >= 3
    assert metric(metrics, "edgetpu_serve_edgetpu_devices") == 1


def test_over_a_socket_without_a_fallback_an_unplugged_tpu_gets_503s_with_retry_after_none_lost(
        tmp_path, plugged_tpus, libedgetpu_double, cat_png):
    a = pci_tpu(tmp_path, 0)
    plugged_tpus.plug(a)
    service = hotplug_service(tmp_path, plugged_tpus, libedgetpu_double, "fail", "edgetpu")
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            load = LoadLoop(service.url, cat_png.read_bytes())
            load.reached(20)
            plugged_tpus.unplug(a)
            load.reached(60)
            gone = client.get("/readyz")
            plugged_tpus.plug(a)
            answers = load.finish()
            # back within a few probe rounds
            until(lambda: client.get("/readyz").status_code == 200, EVENTUALLY_S, "ready again", poll_s=0.05)
            back = client.post("/v1/classify", files={"image": cat_png.read_bytes()})
    finally:
        log = service.stop()
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) <= {200, 503} and statuses[503] > 0, (statuses, log[-4000:])
    assert all(retry == "1" for status, _, retry in answers if status == 503)  # each 503 says when to retry
    assert gone.status_code == 503 and gone.json()["models"][DEFAULT_MODEL]["state"] == "unhealthy"
    assert back.status_code == 200 and back.json()["backend"] == "edgetpu"
