"""/metrics scraped as Prometheus does, parsed by prometheus_client's own parser; values move
with the requests made. TPU temperature from a fake sysfs directory."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import metrics
from app.engines import BACKENDS
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS, ROOT, Service
from tests.doubles.apex_sysfs import fake_apex
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import DEVICES, libedgetpu_double  # noqa: F401


def scrape(client: httpx.Client) -> dict[tuple[str, frozenset], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def documented() -> dict[str, tuple[set[str], set[str]]]:
    """docs/metrics.md's table: metric name -> its labels ("none": no label), and the labels it has under
    several worker processes only ("under several processes also NAME")."""
    rows = re.findall(r"^\| `(edgetpu_serve_\w+)` \| \w+ \| ([^|]*) \|", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    return {name: (set(re.findall(r"`(\w+)`", labels)), set(re.findall(r"under several processes also (\w+)", labels)))
            for name, labels in rows}


def assert_documented(text: str) -> None:
    """Every edgetpu_serve_* metric of a scrape is in the docs' table, and each one with samples has the
    labels the table gives it (one process or several)."""
    table = documented()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("edgetpu_serve_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in table, f"{name} is exposed on /metrics but not in docs/metrics.md's table"
        labels, several = table[name]
        for sample in family.samples:
            assert set(sample.labels) - {"le"} - several == labels, (name, sample.labels, table[name])


def test_counters_and_histograms_move_with_requests(client, cat_png):
    before = scrape(client)
    assert_documented(client.get("/metrics").text)
    image = cat_png.read_bytes()
    assert client.post(f"/v1/models/{DEFAULT_MODEL}/classify", content=image,
                       headers={"content-type": "image/png"}).status_code == 200
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["bm90IGFuIGltYWdl"],
                        "parameters": {"content_type": "base64"}}]}
    assert client.post(f"/v2/models/{DEFAULT_MODEL}/infer", json=body).status_code == 400
    assert client.post("/v2/models/no_such_model/infer", json=body).status_code == 404
    after = scrape(client)
    labels = {"task": "classification", "model": DEFAULT_MODEL, "backend": "cpu"}
    assert value(after, "edgetpu_serve_requests_total", protocol="v1", status="200", **labels) == \
        value(before, "edgetpu_serve_requests_total", protocol="v1", status="200", **labels) + 1
    assert value(after, "edgetpu_serve_requests_total", protocol="v2", status="400", **labels) == \
        value(before, "edgetpu_serve_requests_total", protocol="v2", status="400", **labels) + 1
    # a name the registry does not serve makes no series of its own
    assert value(after, "edgetpu_serve_requests_total", protocol="v2", status="404", task="", model="", backend="") == \
        value(before, "edgetpu_serve_requests_total", protocol="v2", status="404", task="", model="", backend="") + 1
    assert not any("no_such_model" in str(key) for key in after)
    for stage in ("decode", "preprocess", "queue", "inference", "postprocess", "total"):
        count = "edgetpu_serve_stage_seconds_count"
        assert value(after, count, stage=stage, **labels) == value(before, count, stage=stage, **labels) + 1
    assert value(after, "edgetpu_serve_stage_seconds_sum", stage="inference", **labels) > \
        value(before, "edgetpu_serve_stage_seconds_sum", stage="inference", **labels)


def test_pool_and_model_state_are_gauges(client):
    samples = scrape(client)
    labels = {"model": DEFAULT_MODEL, "backend": "cpu"}
    assert value(samples, "edgetpu_serve_model_ready", model=DEFAULT_MODEL) == 1
    assert value(samples, "edgetpu_serve_pool_interpreters", **labels) >= 1
    assert value(samples, "edgetpu_serve_pool_interpreters_busy", **labels) == 0
    assert value(samples, "edgetpu_serve_pool_queue_depth", **labels) == 0
    assert value(samples, "edgetpu_serve_pool_first_inference_seconds", **labels) > 0
    assert value(samples, "edgetpu_serve_model_loads_total", model=DEFAULT_MODEL, result="ok") >= 1
    assert value(samples, "edgetpu_serve_edgetpu_devices") == 0
    assert value(samples, "process_resident_memory_bytes") > 0


def test_reload_counts_and_makes_the_next_request_cold(cat_png):
    # a service of its own: a reload would make the shared one cold for other tests
    svc = Service({"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
                   "EDGETPU_SERVE_WORKERS": "1"})
    try:
        svc.wait_ready()
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            before = scrape(c)
            assert c.post("/v1/models/fashion_mnist/reload").status_code == 200
            assert c.post("/v1/classify", content=cat_png.read_bytes()).json()["cold"] is True
            after = scrape(c)
    finally:
        svc.stop()
    labels = {"model": "fashion_mnist"}
    assert value(before, "edgetpu_serve_model_loads_total", result="ok", **labels) == 1
    assert value(after, "edgetpu_serve_model_loads_total", result="ok", **labels) == 2
    assert value(before, "edgetpu_serve_cold_starts_total", backend="cpu", **labels) == 0
    assert value(after, "edgetpu_serve_cold_starts_total", backend="cpu", **labels) == 1
    assert value(after, "edgetpu_serve_model_loaded_timestamp_seconds", **labels) > \
        value(before, "edgetpu_serve_model_loaded_timestamp_seconds", **labels)


@pytest.fixture
def fashion_registry():
    registry = Registry(Settings(model_dir=MODELS, models=["fashion_mnist"], workers=1))
    registry.configure()
    registry.load_all()
    yield registry
    registry.close()


def test_tpu_temperatures_come_from_the_sysfs_directory(tmp_path):
    for name, millidegrees in (("apex_0", "47800\n"), ("apex_1", "81250\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "temp").write_text(millidegrees)
    (tmp_path / "apex_2").mkdir()  # a TPU whose driver exposes no sensor: no sample
    (tmp_path / "apex_3").mkdir()
    (tmp_path / "apex_3" / "temp").write_text("garbage")
    plugin = BACKENDS["edgetpu"](Settings(plugins={"edgetpu": {"apex_sysfs_dir": tmp_path}}))
    families = {f.name: f for f in plugin.collect([])}  # the gauges the Edge TPU plug-in adds to /metrics
    samples = {s.labels["device"]: s.value for s in families["edgetpu_serve_edgetpu_temperature_celsius"].samples}
    assert samples == {"apex_0": 47.8, "apex_1": 81.25}


def test_a_tensor_input_times_no_image_stages(client):
    meta = client.get("/v2/models/fashion_mnist").json()
    tensor = meta["inputs"][0]
    shape = [1, *tensor["shape"][1:]]
    count = 1
    for d in shape:
        count *= d
    body = {"inputs": [{"name": "image", "datatype": tensor["datatype"], "shape": shape, "data": [0] * count}]}
    before = scrape(client)
    assert client.post("/v2/models/fashion_mnist/infer", json=body).status_code == 200
    after = scrape(client)
    labels = {"task": "classification", "model": "fashion_mnist", "backend": "cpu"}
    moved = {stage: value(after, "edgetpu_serve_stage_seconds_count", stage=stage, **labels)
             - value(before, "edgetpu_serve_stage_seconds_count", stage=stage, **labels)
             for stage in metrics.STAGES}
    assert moved == {"decode": 0, "preprocess": 0, "queue": 1, "inference": 1, "postprocess": 0, "total": 1}


def test_two_tpus_through_the_test_double_count_and_report_temperature(tmp_path, libedgetpu_double, cat_png):
    nodes = [tmp_path / "dev" / "apex_0", tmp_path / "dev" / "apex_1"]
    nodes[0].parent.mkdir()
    for node in nodes:
        node.write_bytes(b"")
    sysfs = tmp_path / "sys" / "class" / "apex"
    fake_apex(sysfs, "apex_0", 52100)
    service = Service({
        "EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(tmp_path / "models")),
        "EDGETPU_SERVE_MODELS": DEFAULT_MODEL,
        "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu", "EDGETPU_SERVE_WORKERS": "1",
        "EDGETPU_SERVE_PROCESSES": "1",  # one process's families (several: tests/test_processes.py checks them too)
        "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
        "EDGETPU_SERVE_APEX_SYSFS_DIR": str(sysfs),
        DEVICES: ",".join(f"pci:{node}" for node in nodes),
    })
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as c:
            assert c.post("/v1/classify?backend=edgetpu", content=cat_png.read_bytes()).status_code == 200
            samples = scrape(c)
            assert_documented(c.get("/metrics").text)  # every family with samples, the TPUs' included
    finally:
        service.stop()
    assert value(samples, "edgetpu_serve_edgetpu_devices") == 2
    assert {device: value(samples, "edgetpu_serve_edgetpu_device_healthy", device=str(device)) for device in nodes} \
        == {node: 1.0 for node in nodes}
    assert value(samples, "edgetpu_serve_edgetpu_temperature_celsius", device="apex_0") == 52.1
    labels = {"model": DEFAULT_MODEL, "backend": "edgetpu"}
    assert value(samples, "edgetpu_serve_pool_interpreters", **labels) == 2
    assert value(samples, "edgetpu_serve_requests_total", protocol="v1", status="200", task="classification",
                 **labels) == 1
    assert value(samples, "edgetpu_serve_pool_first_inference_seconds", **labels) > 0


def test_a_failed_reload_is_counted_and_the_old_version_keeps_serving(tmp_path):
    import shutil

    from prometheus_client import REGISTRY

    from app.errors import ServeError

    shutil.copytree(MODELS / "fashion_mnist", tmp_path / "fashion_mnist")
    registry = Registry(Settings(model_dir=tmp_path, models=["fashion_mnist"], default_model="fashion_mnist",
                                 backends=["cpu"], workers=1, warmup_at_start=False))
    registry.configure()

    def loads(result: str) -> float:
        return REGISTRY.get_sample_value("edgetpu_serve_model_loads_total",
                                         {"model": "fashion_mnist", "result": result}) or 0.0

    ok, failed = loads("ok"), loads("failed")
    registry.load_all()
    try:
        assert (loads("ok"), loads("failed")) == (ok + 1, failed)
        model_file = tmp_path / "fashion_mnist" / "fashion_mnist_int8.tflite"
        data = model_file.read_bytes()
        model_file.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # no longer its recorded sha256
        with pytest.raises(ServeError):
            registry.reload("fashion_mnist")
        assert (loads("ok"), loads("failed")) == (ok + 1, failed + 1)
        assert registry.status("fashion_mnist").state == "degraded"
    finally:
        registry.close()
