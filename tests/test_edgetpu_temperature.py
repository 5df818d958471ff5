"""A PCIe TPU's temperature from a FAKE sysfs (the apex driver's files, written by the tests): its trip points
and warning levels on /metrics and /v1/devices, and, above EDGETPU_SERVE_EDGETPU_TEMPERATURE_WARN_CELSIUS, one
warning line and its models degraded in /readyz, until it cools. The TPUs are the libedgetpu TEST DOUBLE's."""

from __future__ import annotations

import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.edgetpu.temperature import ApexTemperature, HwWarning, TemperatureWatch, apex_temperatures, read_apex
from app.engines import BACKENDS
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, Service
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.apex_sysfs import fake_apex
from tests.doubles.libedgetpu import DEVICES, libedgetpu_double  # noqa: F401

SETTING = "EDGETPU_SERVE_EDGETPU_TEMPERATURE_WARN_CELSIUS"


def test_every_file_the_driver_exposes_is_read(tmp_path):
    reading = read_apex(fake_apex(tmp_path, "apex_0", 47800))
    assert reading == ApexTemperature("apex_0", 47.8, (85.0, 90.0, 95.0),
                                      (HwWarning(1, 100.0, False), HwWarning(2, 110.0, True)))
    older = read_apex(fake_apex(tmp_path, "apex_1", 51000, driver_files=False))  # a driver with `temp` only
    assert older == ApexTemperature("apex_1", 51.0, (None, None, None), ())
    (tmp_path / "apex_2").mkdir()  # no sensor
    (tmp_path / "apex_3").mkdir()
    (tmp_path / "apex_3" / "temp").write_text("garbage")
    assert [r.device for r in apex_temperatures(tmp_path)] == ["apex_0", "apex_1"]
    assert apex_temperatures(tmp_path / "missing") == []


def test_one_line_when_it_gets_hot_and_one_when_it_cools(tmp_path, caplog):
    watch = TemperatureWatch(tmp_path, 80.0, SETTING)
    fake_apex(tmp_path, "apex_0", 79900)
    caplog.set_level(logging.INFO, logger="app.edgetpu.temperature")
    assert watch.hot() == {} and not caplog.records
    fake_apex(tmp_path, "apex_0", 80000)  # at the threshold: hot
    for _ in range(3):
        hot = watch.hot()
    assert list(hot) == ["apex_0"] and hot["apex_0"].startswith(f"apex_0 at 80 °C, at or above {SETTING}=80")
    assert "lowers its clock from 85 °C (trip points 85, 90, 95 °C)" in hot["apex_0"]
    assert "EDGETPU_SERVE_EDGETPU_PERFORMANCE" in hot["apex_0"]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", f"Edge TPU {hot['apex_0']}")]
    fake_apex(tmp_path, "apex_0", 64000)
    watch.read()
    watch.read()
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert caplog.records[-1].getMessage() == f"Edge TPU apex_0 back at 64 °C, below {SETTING}=80"


def test_the_gauges_beside_the_temperature(tmp_path):
    fake_apex(tmp_path, "apex_0", 47800)
    plugin = BACKENDS["edgetpu"](Settings(plugins={"edgetpu": {"apex_sysfs_dir": tmp_path,
                                                               "temperature_warn_celsius": 75}}))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in plugin.collect([]) for s in f.samples}
    prefix = "edgetpu_serve_edgetpu_temperature"
    assert samples[(f"{prefix}_celsius", (("device", "apex_0"),))] == 47.8
    assert [samples[(f"{prefix}_trip_point_celsius", (("device", "apex_0"), ("trip_point", str(i))))]
            for i in range(3)] == [85.0, 90.0, 95.0]
    assert samples[(f"{prefix}_hw_warning_celsius", (("device", "apex_0"), ("level", "2")))] == 110.0
    assert samples[(f"{prefix}_hw_warning_enabled", (("device", "apex_0"), ("level", "1")))] == 0.0
    assert samples[(f"{prefix}_hw_warning_enabled", (("device", "apex_0"), ("level", "2")))] == 1.0
    assert samples[(f"{prefix}_warn_celsius", ())] == 75.0


def test_a_hot_tpu_degrades_its_models_until_it_cools(tmp_path, libedgetpu_double, cat_png):
    """Two PCIe TPUs through the double; apex_0's driver files in a fake sysfs, apex_1 without a sensor."""
    nodes = [tmp_path / "dev" / "apex_0", tmp_path / "dev" / "apex_1"]
    nodes[0].parent.mkdir()
    for node in nodes:
        node.write_bytes(b"")
    sysfs = tmp_path / "sys" / "class" / "apex"
    fake_apex(sysfs, "apex_0", 52100)
    service = Service({
        "EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(tmp_path / "models")),
        "EDGETPU_SERVE_MODELS": DEFAULT_MODEL, "EDGETPU_SERVE_PROCESSES": "1",  # one process's readiness
        "EDGETPU_SERVE_BACKENDS": "edgetpu", "EDGETPU_SERVE_WORKERS": "1",
        "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
        "EDGETPU_SERVE_APEX_SYSFS_DIR": str(sysfs),
        DEVICES: ",".join(f"pci:{node}" for node in nodes),
    })
    try:
        service.wait_ready()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            cool = client.get("/readyz").json()["models"][DEFAULT_MODEL]
            devices = {d["path"]: d for d in client.get("/v1/devices").json()["backends"]["edgetpu"]["devices"]}
            metrics = client.get("/metrics").text
            fake_apex(sysfs, "apex_0", 86500)  # past the first trip point: the driver slows it down
            hot = [client.get("/readyz") for _ in range(3)]
            hot_devices = {d["path"]: d for d in client.get("/v1/devices").json()["backends"]["edgetpu"]["devices"]}
            still_served = client.post("/v1/classify", files={"image": cat_png.read_bytes()})
            fake_apex(sysfs, "apex_0", 61000)
            cooled = client.get("/readyz").json()["models"][DEFAULT_MODEL]
    finally:
        service.stop()
    assert cool == {**cool, "state": "ready", "error": None}
    assert devices[str(nodes[0])]["temperature"] == {
        "celsius": 52.1, "warn_celsius": 80.0, "hot": False, "trip_points_celsius": [85.0, 90.0, 95.0],
        "hw_warnings": [{"level": 1, "celsius": 100.0, "enabled": False},
                        {"level": 2, "celsius": 110.0, "enabled": True}]}
    assert devices[str(nodes[1])]["temperature"] is None  # no sensor in the fake sysfs
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    trips = {s.labels["trip_point"]: s.value for s in families["edgetpu_serve_edgetpu_temperature_trip_point_celsius"].samples}
    assert trips == {"0": 85.0, "1": 90.0, "2": 95.0}
    for response in hot:
        assert response.status_code == 200  # degraded still serves
        state = response.json()["models"][DEFAULT_MODEL]
        assert state["state"] == "degraded"
        assert state["error"].startswith(f"edgetpu: apex_0 at 86.5 °C, at or above {SETTING}=80")
    assert hot_devices[str(nodes[0])]["temperature"]["hot"] is True
    assert still_served.status_code == 200 and still_served.json()["backend"] == "edgetpu"
    assert cooled["state"] == "ready" and cooled["error"] is None
    log = service.output()
    assert log.count("WARNING app.edgetpu.temperature: Edge TPU apex_0 at 86.5 °C") == 1, log[-3000:]
    assert log.count("Edge TPU apex_0 back at 61 °C") == 1
