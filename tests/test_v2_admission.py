"""v2 admission on the lease core: a place in line before the body is read, one place per input
of a batch (all or none), and the backend a request names served from its own line."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from prometheus_client import REGISTRY

from app.main import create_app
from app.api.deps import service_of
from app.settings import Settings
from tests.conftest import MODELS

MODEL = "fashion_mnist"
URL = f"/v2/models/{MODEL}/infer"


@pytest.fixture(scope="module")
def app():
    # one interpreter and one waiting place per pool: a line of 2
    app = create_app(Settings(model_dir=MODELS, models=[MODEL], default_model=MODEL, backends=["cpu", "emulated"],
                              workers=1, max_waiting=1, warmup_at_start=False))
    service_of(app).registry.load_all()  # the lifespan does this in a real process
    yield app
    service_of(app).registry.close()
    service_of(app).images.close()


def tensor_request(n: int, backend: str | None = None) -> bytes:
    body = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [n, 28, 28, 1],
                        "data": np.zeros(n * 28 * 28, np.uint8).tolist()}]}
    if backend is not None:
        body["parameters"] = {"backend": backend}
    return json.dumps(body).encode()


def post(app, *requests: bytes) -> list[httpx.Response]:
    async def calls():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return [await c.post(URL, content=body, headers={"content-type": "application/json"})
                    for body in requests]
    return asyncio.run(calls())


def pool(app, backend: str):
    return service_of(app).registry.get(MODEL).pool(backend)


def refused(backend: str = "cpu") -> float:
    labels = {"protocol": "v2", "task": "classification", "model": MODEL, "backend": backend, "status": "503"}
    return REGISTRY.get_sample_value("edgetpu_serve_requests_total", labels) or 0.0


def test_a_batch_takes_a_place_per_input_and_is_refused_whole_when_the_line_is_short(app):
    before = refused()
    fits, too_many = post(app, tensor_request(2), tensor_request(3))
    assert fits.status_code == 200, fits.text
    assert [o["shape"] for o in fits.json()["outputs"]] == [[2, 10], [2, 10]]
    assert too_many.status_code == 503 and "retry-after" in too_many.headers
    assert "busy" in too_many.json()["error"]
    assert pool(app, "cpu").line.admitted == 0  # every place given back, the refused batch's too
    assert refused() == before + 1  # counted against the model whose line refused it


def test_a_full_line_refuses_before_the_body_is_read(app):
    cpu = pool(app, "cpu")
    held = [cpu.admit(), cpu.admit()]  # the line of 2 is full
    try:
        (r,) = post(app, b"{ not json at all")
        assert r.status_code == 503, r.text  # not the 400 the body would earn
    finally:
        for place in held:
            place.release()
    (r,) = post(app, b"{ not json at all")
    assert r.status_code == 400


def test_the_named_backend_is_served_from_its_own_line(app):
    cpu = pool(app, "cpu")
    held = [cpu.admit(), cpu.admit()]  # cpu's line full; the default backend's place is given back
    try:
        # the admission place is taken on the default (cpu) line before the body names emulated,
        # so a full default line still refuses: admission cannot wait for the body
        (refused,) = post(app, tensor_request(1, "emulated"))
        assert refused.status_code == 503
    finally:
        for place in held:
            place.release()
    (r,) = post(app, tensor_request(2, "emulated"))
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["backend"] == "emulated"
    assert pool(app, "cpu").line.admitted == 0 and pool(app, "emulated").line.admitted == 0
    (unknown,) = post(app, tensor_request(1, "nope"))
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]
