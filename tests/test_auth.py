"""API keys: the dependencies on a small app of their own, and the real service with keys set."""

import hmac
from types import SimpleNamespace

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from starlette.testclient import TestClient

from app.api import auth, errors
from app.api.deps import HttpDoor, attach
from app.api.keys import ApiKeys
from app.api.routes import InferenceRoutes
from app.errors import ServeError
from app.settings import Settings
from tests.conftest import Service

INFERENCE_KEY, OLD_INFERENCE_KEY, ADMIN_KEY = "inf-2b7e151628aed2a6", "inf-old-abf71588", "adm-09cf4f3c762e71"


def keyed_app(**settings) -> FastAPI:
    """Two routes, one per level, guarded as app/main.py guards the real routers."""
    settings = Settings(**settings)
    app = FastAPI()
    # a service double: the key checks read its settings only
    attach(app, HttpDoor(SimpleNamespace(settings=settings, core=None), ApiKeys.from_settings(settings),
                         InferenceRoutes.of([])))
    errors.install(app)
    inference, admin = APIRouter(), APIRouter()
    inference.get("/infer")(lambda: {"ok": True})
    admin.post("/admin")(lambda: {"ok": True})
    app.include_router(inference, dependencies=[auth.InferenceKey])
    app.include_router(admin, dependencies=[auth.AdminKey])
    return app


@pytest.fixture
def keyed():
    return TestClient(keyed_app(api_keys=[INFERENCE_KEY, OLD_INFERENCE_KEY], admin_keys=[ADMIN_KEY]))


@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {INFERENCE_KEY}"}, {"X-API-Key": INFERENCE_KEY},
                                     {"Authorization": f"bearer {OLD_INFERENCE_KEY}"}, {"X-API-Key": ADMIN_KEY}])
def test_inference_accepts_any_inference_or_admin_key_either_way(keyed, headers):
    assert keyed.get("/infer", headers=headers).status_code == 200


@pytest.mark.parametrize("headers, message", [
    ({}, "an API key is required"), ({"X-API-Key": "wrong"}, "not valid"),
    ({"Authorization": f"Basic {INFERENCE_KEY}"}, "an API key is required"),
    ({"X-API-Key": INFERENCE_KEY[:-1]}, "not valid"),
])
def test_inference_without_a_valid_key_is_401_json_with_a_challenge(keyed, headers, message):
    r = keyed.get("/infer", headers=headers)
    assert r.status_code == 401 and message in r.json()["error"]
    assert r.headers["www-authenticate"] == 'Bearer realm="edgetpu-serve"'


def test_admin_needs_an_admin_key(keyed):
    assert keyed.post("/admin").status_code == 401
    assert keyed.post("/admin", headers={"X-API-Key": "nope"}).status_code == 401
    r = keyed.post("/admin", headers={"X-API-Key": INFERENCE_KEY})
    assert r.status_code == 403 and r.json() == {"error": "this API key is not an admin key"}
    assert keyed.post("/admin", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200


def test_without_keys_inference_is_open_and_admin_open_on_loopback_only():
    local = TestClient(keyed_app(host="127.0.0.1"))
    assert local.get("/infer").status_code == 200 and local.post("/admin").status_code == 200
    for host in ("0.0.0.0", "::", "192.168.1.20", "edgetpu.local"):
        exposed = TestClient(keyed_app(host=host))
        assert exposed.get("/infer").status_code == 200
        r = exposed.post("/admin")
        assert r.status_code == 403 and "EDGETPU_SERVE_ADMIN_KEYS" in r.json()["error"]


def test_keys_from_files_as_docker_and_kubernetes_secrets_mount_them(tmp_path):
    (tmp_path / "api_keys").write_text(f"# rotated 2026-11\n{INFERENCE_KEY}\n\n{OLD_INFERENCE_KEY}\n")
    (tmp_path / "admin_keys").write_text(f"{ADMIN_KEY}\n")
    c = TestClient(keyed_app(api_keys_file=tmp_path / "api_keys", admin_keys_file=tmp_path / "admin_keys",
                             host="0.0.0.0"))
    assert c.get("/infer", headers={"X-API-Key": OLD_INFERENCE_KEY}).status_code == 200
    assert c.get("/infer", headers={"X-API-Key": "# rotated 2026-11"}).status_code == 401
    assert c.post("/admin", headers={"X-API-Key": ADMIN_KEY}).status_code == 200


def test_an_unreadable_key_file_stops_the_start(tmp_path):
    with pytest.raises(ServeError, match="cannot read API keys"):
        ApiKeys.from_settings(Settings(api_keys_file=tmp_path / "missing"))


def test_keys_stay_out_of_the_settings_repr():
    assert INFERENCE_KEY not in repr(Settings(api_keys=[INFERENCE_KEY], admin_keys=[ADMIN_KEY]))


def test_every_key_is_compared():
    calls = []
    real = hmac.compare_digest
    try:
        hmac.compare_digest = lambda a, b: calls.append(b) or real(a, b)
        assert auth.matches(b"k1", (b"k1", b"k2", b"k3"))
    finally:
        hmac.compare_digest = real
    assert calls == [b"k1", b"k2", b"k3"]  # no early exit on the first match


def test_the_real_service_with_keys(cat_png):
    svc = Service({"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
                   "EDGETPU_SERVE_API_KEYS": f"{INFERENCE_KEY},{OLD_INFERENCE_KEY}",
                   "EDGETPU_SERVE_ADMIN_KEYS": ADMIN_KEY})
    try:
        svc.wait_ready()  # /readyz is open
        with httpx.Client(base_url=svc.url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
            reload = "/v1/models/fashion_mnist/reload"
            r = c.post(reload)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
            assert c.post(reload, headers={"X-API-Key": INFERENCE_KEY}).status_code == 403
            assert c.post(reload, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
            image = cat_png.read_bytes()
            assert c.post("/v1/classify", content=image, headers={"content-type": "image/png"}).status_code == 401
            assert c.get("/v1/models").status_code == 401
            r = c.post("/v1/classify", content=image,
                       headers={"content-type": "image/png", "X-API-Key": OLD_INFERENCE_KEY})
            assert r.status_code == 200 and r.json()["predictions"]
            # /v2: health open like /healthz, the rest and /metrics take the inference key
            assert c.get("/v2/health/live").status_code == 200 and c.get("/v2/health/ready").status_code == 200
            for path in ("/v2", "/v2/models/fashion_mnist", "/v2/models/fashion_mnist/config", "/metrics"):
                r = c.get(path)
                assert r.status_code == 401 and r.json()["error"], path
                assert c.get(path, headers={"Authorization": f"Bearer {INFERENCE_KEY}"}).status_code == 200, path
            infer = "/v2/models/fashion_mnist/infer"
            body = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1], "data": [0] * 784}]}
            assert c.post(infer, json=body).status_code == 401
            r = c.post(infer, json=body, headers={"X-API-Key": INFERENCE_KEY})
            assert r.status_code == 200 and r.json()["outputs"]
    finally:
        svc.stop()
