"""Backends as plug-ins: the product's list, one left out when its runtime will not import,
and a backend registered from outside served like any other."""

import asyncio

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.core import GaugeMetricFamily

from app import metrics
from app.engines import (
    BACKENDS,
    ENGINES,
    Backend,
    EngineOptions,
    Fallback,
    PluginSettings,
    TensorSpec,
    load_plugins,
    register,
    unregister,
)
from app.errors import ServeError
from app.main import create_app
from app.api.deps import service_of
from app.registry import Registry
from app.settings import Settings, plugin_config
from tests.conftest import DEFAULT_MODEL, MODELS


class EchoEngineDouble:
    """TEST DOUBLE engine: a simulated accelerator that returns a fixed output."""

    key = "echo"
    model_file = "int8"
    loads = []

    def __init__(self, options):
        self.inputs = (TensorSpec("in", (1, 224, 224, 3), np.dtype(np.uint8), 1 / 128, 127),)
        self.outputs = (TensorSpec("out", (1, 1000), np.dtype(np.uint8), 1 / 256, 0),)
        self.options = options

    @classmethod
    def load(cls, path, options):
        cls.loads.append(path.name)
        return cls(options)

    def run(self, inputs):
        out = np.zeros(self.outputs[0].shape, np.uint8)
        out[0, 7] = 255
        return [out]

    def close(self):
        pass


class EchoBackendDouble(Backend):
    """TEST DOUBLE plug-in: three interpreters, whatever `workers` says."""

    key = "echo"
    engine = EchoEngineDouble

    def interpreters(self):
        return super().interpreters()[:1] * 3


def test_the_product_plugins_are_registered_by_key():
    assert {"cpu", "emulated", "edgetpu"} <= set(BACKENDS)
    assert all(ENGINES[key] is BACKENDS[key].engine for key in BACKENDS)


def test_a_plugin_whose_runtime_will_not_import_is_left_out(caplog):
    left_out = load_plugins(("app.engines.cpu", "app.engines.no_such_runtime"))
    assert list(left_out) == ["app.engines.no_such_runtime"] and "no_such_runtime" in left_out["app.engines.no_such_runtime"]
    assert "cpu" in BACKENDS and "backend no_such_runtime left out" in caplog.text


def test_a_backend_registered_from_outside_is_served_like_any_other():
    register(EchoBackendDouble)
    try:
        registry = Registry(Settings(model_dir=MODELS, models=[DEFAULT_MODEL], backends=["echo", "cpu"], workers=1))
        registry.configure()
        registry.load_all()
        assert registry.ready() and registry.default_backend == "echo"
        assert EchoEngineDouble.loads[-3:] == [f"{DEFAULT_MODEL}_int8.tflite"] * 3

        async def one():
            async with registry.ticket(DEFAULT_MODEL) as ticket:
                return ticket.backend, await ticket.run(np.zeros((1, 224, 224, 3), np.uint8))

        backend, result = asyncio.run(one())
        assert backend == "echo" and len(registry.get(DEFAULT_MODEL).pool("echo").members) == 3
        assert int(result.outputs[0].argmax()) == 7
        registry.close()
    finally:
        unregister("echo")
    assert "echo" not in BACKENDS
    with pytest.raises(Exception, match="unknown backend 'echo'"):
        Registry(Settings(model_dir=MODELS, backends=["echo"]))


class ThrowawayEngineDouble(EchoEngineDouble):
    """TEST DOUBLE engine of the throwaway plug-in: answers class 3."""

    key = "throwaway"

    def run(self, inputs):
        out = np.zeros(self.outputs[0].shape, np.uint8)
        out[0, 3] = 255
        return [out]


class ThrowawaySettings(PluginSettings):
    """TEST DOUBLE plug-in settings: read from EDGETPU_SERVE_THROWAWAY_*."""

    model_config = plugin_config("throwaway")

    boards: int = 1
    refuse: list[str] = []  # models it says it cannot serve (served by cpu instead)


class ThrowawayBackendDouble(Backend):
    """TEST DOUBLE plug-in, from outside the app package: an accelerator with its own settings,
    device report, gauge, fallback policy and watchdog default; the core names none of them."""

    key = "throwaway"
    engine = ThrowawayEngineDouble
    host_cpu = False
    watched = True
    settings_class = ThrowawaySettings

    def start(self, models):
        return {name: Fallback("cpu", f"throwaway: board {self.config.boards} is unplugged")
                for name in models if name in self.config.refuse}

    def interpreters(self):
        return [EngineOptions()] * self.config.boards

    def report(self, members):
        return {"boards": self.config.boards, "interpreters": [member.model for member in members]}

    def collect(self, members):
        gauge = GaugeMetricFamily(f"{metrics.PREFIX}_throwaway_boards", "Boards of the throwaway plug-in")
        gauge.add_metric([], self.config.boards)
        yield gauge


@pytest.fixture
def throwaway():
    register(ThrowawayBackendDouble)
    yield ThrowawayBackendDouble
    unregister(ThrowawayBackendDouble.key)


def test_a_plugin_registered_from_outside_shows_in_devices_metrics_and_readyz(throwaway, monkeypatch, cat_png):
    monkeypatch.setenv("EDGETPU_SERVE_THROWAWAY_BOARDS", "2")  # its own settings, from its own variables
    settings = Settings(model_dir=MODELS, models=[DEFAULT_MODEL, "fashion_mnist"], backends=["throwaway", "cpu"],
                        workers=1, plugins={"throwaway": {"refuse": ["fashion_mnist"]}})
    app = create_app(settings)
    with TestClient(app) as client:
        registry = service_of(app).registry
        assert registry.wait_loaded(30)
        assert registry.get(DEFAULT_MODEL).pool("throwaway").watchdog is not None  # watched: its plug-in says so
        assert registry.get(DEFAULT_MODEL).pool("cpu").watchdog is None

        devices = client.get("/v1/devices").json()["backends"]
        assert devices["throwaway"] == {"boards": 2, "interpreters": [DEFAULT_MODEL] * 2}

        scraped = client.get("/metrics").text
        assert "edgetpu_serve_throwaway_boards 2.0" in scraped
        assert f'edgetpu_serve_pool_interpreters{{backend="throwaway",model="{DEFAULT_MODEL}"}} 2.0' in scraped

        ready = client.get("/readyz")
        assert ready.status_code == 200
        models = ready.json()["models"]
        assert models[DEFAULT_MODEL]["state"] == "ready"
        assert models["fashion_mnist"]["state"] == "degraded"
        assert "throwaway requested, serving on cpu: throwaway: board 2 is unplugged" in models["fashion_mnist"]["error"]

        answer = client.post("/v1/classify?backend=throwaway", content=cat_png.read_bytes(),
                             headers={"content-type": "image/png"})
        assert answer.status_code == 200 and answer.json()["predictions"][0]["index"] == 3


def test_a_plugins_wrong_or_unknown_settings_stop_the_start(throwaway, monkeypatch):
    with pytest.raises(ServeError, match=r"settings for unknown backends \['nope'\]"):
        Registry(Settings(model_dir=MODELS, plugins={"nope": {}}))
    with pytest.raises(ServeError, match="settings of backend 'throwaway': EDGETPU_SERVE_THROWAWAY_BOARDS: .* 'many'"):
        Registry(Settings(model_dir=MODELS, plugins={"throwaway": {"boards": "many"}}))
    monkeypatch.setenv("EDGETPU_SERVE_THROWAWAY_BOARDS", "none")
    with pytest.raises(ServeError, match="EDGETPU_SERVE_THROWAWAY_BOARDS"):
        Registry(Settings(model_dir=MODELS))


def test_the_watchdog_setting_overrides_the_plugins_own_default(throwaway):
    registry = Registry(Settings(model_dir=MODELS, backends=["throwaway"], watchdog_backends=[]))
    assert not registry.loader.watched("throwaway")
    registry = Registry(Settings(model_dir=MODELS, backends=["throwaway"]))
    assert registry.loader.watched("throwaway") and not registry.loader.watched("cpu")

