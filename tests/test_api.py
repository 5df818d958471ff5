"""End to end: the real service (python -m app) on a real socket, real photos, real HTTP."""

import io
import socket

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import DEFAULT_MODEL, Service

CAT_CLASSES = {281, 282, 283, 284, 285, 286, 287}  # tabby ... lynx: ImageNet's domestic and wild cats


def test_cat_photo_multipart(client, cat_png):
    r = client.post("/v1/classify", files={"image": ("chelsea.png", cat_png.read_bytes(), "image/png")})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == DEFAULT_MODEL and body["backend"] == "cpu"
    assert len(body["predictions"]) == 5
    assert {p["index"] for p in body["predictions"]} & CAT_CLASSES
    assert any("cat" in p["label"] for p in body["predictions"])
    scores = [p["score"] for p in body["predictions"]]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
    t = body["timing_ms"]
    assert t["total"] >= t["inference"] > 0
    assert t["total"] >= t["decode"] + t["preprocess"] + t["queue"] + t["inference"] + t["postprocess"] - 0.5
    assert t["queue"] >= 0
    assert min(t.values()) >= 0
    assert body["warmup"]["load_ms"] > 0 and body["warmup"]["first_inference_ms"] > 0
    assert body["cold"] is False  # warmed up at start


@pytest.mark.parametrize("content_type", ["image/jpeg", "application/octet-stream"])
def test_raw_body_jpeg(client, china_jpg, content_type):
    r = client.post(f"/v1/models/{DEFAULT_MODEL}/classify", params={"top_k": 3},
                    content=china_jpg.read_bytes(), headers={"content-type": content_type})
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert len(predictions) == 3
    assert predictions[0]["label"] in ("palace", "monastery", "pagoda, pagoda tree", "bell cote, bell cot")


def test_coffee_top1(client, coffee_png):
    r = client.post("/v1/classify", params={"top_k": 1}, content=coffee_png.read_bytes(),
                    headers={"content-type": "image/png"})
    assert r.json()["predictions"][0]["label"] in ("espresso", "cup", "coffee mug")


def test_threshold_filters(client, cat_png):
    r = client.post("/v1/classify", params={"top_k": 1000, "threshold": 0.05},
                    content=cat_png.read_bytes(), headers={"content-type": "image/png"})
    predictions = r.json()["predictions"]
    assert 1 <= len(predictions) < 20 and all(p["score"] >= 0.05 for p in predictions)


def test_exif_rotated_photo_classifies_like_the_upright_one(client, cat_png):
    upright = Image.open(cat_png)
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # as a camera stores it ...
    exif = Image.Exif()
    exif[0x0112] = 6  # ... with "rotate 90 clockwise to view"
    buf = io.BytesIO()
    stored.save(buf, "JPEG", quality=95, exif=exif)
    r = client.post("/v1/classify", content=buf.getvalue(), headers={"content-type": "image/jpeg"})
    assert {p["index"] for p in r.json()["predictions"][:3]} & CAT_CLASSES


def test_models_listing_and_detail(client):
    listing = client.get("/v1/models").json()
    assert listing["default_model"] == DEFAULT_MODEL and listing["default_backend"] == "cpu"
    detail = client.get(f"/v1/models/{DEFAULT_MODEL}").json()
    assert detail["state"] == "ready" and detail["labels"] == 1000
    cpu = detail["backends"]["cpu"]
    assert cpu["input"]["dtype"] == "uint8" and cpu["input"]["shape"] == [1, 224, 224, 3]
    assert cpu["input"]["scale"] == 1 / 128 and cpu["input"]["zero_point"] == 127
    assert len(detail["files"]["int8"]["sha256"]) == 64
    assert detail["input"]["resize"] == "center_crop"


def test_reload_makes_the_next_request_cold(service, cat_png):
    # a service of its own: reload would make the shared one cold for other tests
    svc = Service({"EDGETPU_SERVE_WORKERS": "1"})
    try:
        svc.wait_ready()
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            send = lambda: c.post("/v1/classify", content=cat_png.read_bytes(), headers={"content-type": "image/png"}).json()  # noqa: E731
            assert send()["cold"] is False
            reloaded = c.post(f"/v1/models/{DEFAULT_MODEL}/reload").json()
            assert reloaded["backends"]["cpu"]["warm"] is False
            cold = send()
            assert cold["cold"] is True
            assert cold["warmup"]["first_inference_ms"] == cold["timing_ms"]["inference"]
            assert send()["cold"] is False
    finally:
        svc.stop()


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"live": True}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"][DEFAULT_MODEL]["state"] == "ready"


def big_png(width, height) -> bytes:
    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "path, params, headers, body, status, message",
    [
        ("/v1/classify", {}, {"content-type": "image/jpeg"}, b"", 400, "empty"),
        ("/v1/classify", {}, {"content-type": "image/jpeg"}, b"definitely not a jpeg", 400, "not an image"),
        ("/v1/classify", {}, {"content-type": "text/plain"}, b"hello", 415, "content type"),
        ("/v1/classify", {}, {"content-type": "application/json"}, b"{}", 415, "curl -F image=@"),
        ("/v1/models/resnet50/classify", {}, {"content-type": "image/jpeg"}, b"x", 404, "no model 'resnet50'"),
        ("/v1/classify", {"top_k": "0"}, {"content-type": "image/jpeg"}, b"x", 422, "top_k"),
        ("/v1/classify", {"top_k": "many"}, {"content-type": "image/jpeg"}, b"x", 422, "top_k"),
        ("/v1/classify", {"top_k": "1001"}, {"content-type": "image/jpeg"}, b"x", 422, "top_k"),
        ("/v1/classify", {"threshold": "2"}, {"content-type": "image/jpeg"}, b"x", 422, "threshold"),
        ("/v1/classify", {"backend": "gpu"}, {"content-type": "image/jpeg"}, b"x", 422, "backend 'gpu'"),
        ("/v1/classify", {}, {"content-type": "multipart/form-data; boundary=xyz"}, b"--xyz\r\nbroken", 400, ""),
        ("/v1/classify", {}, {"content-type": "image/png"}, big_png(10000, 5000), 413, "50000000 pixels"),
        ("/v1/classify", {}, {"content-type": "image/png"}, b"\0" * (4 * 1024 * 1024 + 1), 413, "limit"),
    ],
)
def test_bad_input_gets_a_json_4xx(client, path, params, headers, body, status, message):
    r = client.post(path, params=params, headers=headers, content=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message.lower() in r.json()["error"].lower()


def test_truncated_jpeg(client, china_jpg):
    data = china_jpg.read_bytes()
    r = client.post("/v1/classify", content=data[: len(data) // 3], headers={"content-type": "image/jpeg"})
    assert r.status_code == 400 and "truncated" in r.json()["error"]


def test_multipart_without_image_field(client, cat_png):
    r = client.post("/v1/classify", files={"photo": ("c.png", cat_png.read_bytes(), "image/png")})
    assert r.status_code == 400 and "no field 'image'" in r.json()["error"]


def test_unknown_route_and_method(client):
    assert client.get("/v2/nothing").json() == {"error": "Not Found"}
    r = client.get("/v1/classify")
    assert r.status_code == 405 and "error" in r.json()


def test_chunked_body_over_the_limit_is_cut_off(client):
    def chunks():
        for _ in range(5):
            yield b"\0" * (1024 * 1024)

    r = client.post("/v1/classify", content=chunks(), headers={"content-type": "image/jpeg"})
    assert r.status_code == 413


def test_concurrent_requests_all_answer(service, cat_png):
    import concurrent.futures

    data = cat_png.read_bytes()

    def one(_):
        with httpx.Client(base_url=service.url, timeout=30) as c:
            return c.post("/v1/classify", content=data, headers={"content-type": "image/png"}).json()

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(16)))
    tops = {r["predictions"][0]["index"] for r in results}
    assert len(tops) == 1  # the same photo gets the same answer from every interpreter


def test_service_survives_a_client_that_hangs_up(service, cat_png):
    data = cat_png.read_bytes()
    with socket.create_connection(("127.0.0.1", service.port)) as s:
        s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                  + f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:1000])
    r = httpx.post(f"{service.url}/v1/classify", content=data, headers={"content-type": "image/png"})
    assert r.status_code == 200


def test_start_fails_clearly_on_a_missing_model(tmp_path):
    svc = Service({"EDGETPU_SERVE_MODEL_DIR": str(tmp_path)})
    assert svc.process.wait(30) == 2
    assert "no model directories" in svc.output()


def test_full_pool_answers_503_with_retry_after(cat_png):
    svc = Service({"EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_MAX_WAITING": "0", "EDGETPU_SERVE_RETRY_AFTER_S": "3"})
    try:
        svc.wait_ready()
        import concurrent.futures

        data = cat_png.read_bytes()

        def one(_):
            return httpx.post(f"{svc.url}/v1/classify", content=data, headers={"content-type": "image/png"}, timeout=30)

        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            responses = list(ex.map(one, range(24)))
        busy = [r for r in responses if r.status_code == 503]
        assert busy, "24 concurrent requests on 1 interpreter with no waiting line: some must be refused"
        assert all(r.headers["retry-after"] == "3" and "busy" in r.json()["error"] for r in busy)
        assert all(r.status_code in (200, 503) for r in responses)
    finally:
        svc.stop()


def test_readyz_is_503_until_models_are_loaded():
    import asyncio

    from app.main import create_app
    from app.settings import Settings
    from tests.conftest import MODELS

    app = create_app(Settings(model_dir=MODELS))  # lifespan not run: nothing loaded yet

    async def probe():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get("/readyz"), await c.post("/v1/classify", content=b"x", headers={"content-type": "image/png"})

    ready, classify = asyncio.run(probe())
    assert ready.status_code == 503 and ready.json()["models"][DEFAULT_MODEL]["state"] == "loading"
    assert classify.status_code == 503 and "loading" in classify.json()["error"]
