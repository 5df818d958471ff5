"""Backends as plug-ins: the product's list, one left out when its runtime will not import,
and a backend registered from outside served like any other."""

import asyncio

import numpy as np
import pytest

from app.engines import BACKENDS, ENGINES, Backend, TensorSpec, load_plugins, register, unregister
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS


class EchoEngineDouble:
    """TEST DOUBLE engine: a simulated accelerator that returns a fixed output."""

    key = "echo"
    model_file = "int8"
    loads = []

    def __init__(self, options):
        self.input = TensorSpec("in", (1, 224, 224, 3), np.dtype(np.uint8), 1 / 128, 127)
        self.output = TensorSpec("out", (1, 1000), np.dtype(np.uint8), 1 / 256, 0)
        self.options = options

    @classmethod
    def load(cls, path, options):
        cls.loads.append(path.name)
        return cls(options)

    def run(self, x):
        out = np.zeros(self.output.shape, np.uint8)
        out[0, 7] = 255
        return out

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
            async with registry.lease(DEFAULT_MODEL) as lease:
                return lease.backend, await lease.run(np.zeros((1, 224, 224, 3), np.uint8))

        backend, result = asyncio.run(one())
        assert backend == "echo" and len(registry.get(DEFAULT_MODEL).pool("echo").members) == 3
        assert int(result.output.argmax()) == 7
        registry.close()
    finally:
        unregister("echo")
    assert "echo" not in BACKENDS
    with pytest.raises(Exception, match="unknown backend 'echo'"):
        Registry(Settings(model_dir=MODELS, backends=["echo"]))
