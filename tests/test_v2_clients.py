"""The v2 API through the clients people use, over a real socket: tritonclient (sync and async,
JSON and binary, images and tensors, classification, gzip/deflate) and KServe's REST client.
Each must give the native API's top-5 for a real photo."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from app.imaging import prepare
from app.model_dir.reading import read_model_dir
from bench.client_venv import ensure_venv
from tests.conftest import DEFAULT_MODEL, MODELS

MODEL = DEFAULT_MODEL
KSERVE_SCRIPT = Path(__file__).parent / "clients" / "kserve_classify.py"


def native_top5(client: httpx.Client, image: Path) -> list[int]:
    r = client.post(f"/v1/models/{MODEL}/classify?top_k=5", content=image.read_bytes(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    return [p["index"] for p in r.json()["predictions"]]


def top5(scores: np.ndarray) -> list[int]:
    return np.argsort(-scores, kind="stable")[:5].tolist()


def pixels(image: Path) -> np.ndarray:
    """The model's input tensor, made by the client: EfficientNet-Lite0's uint8 input is the raw pixels."""
    return prepare(image.read_bytes(), read_model_dir(MODELS / MODEL).manifest.input, 50_000_000)[None]


@pytest.fixture(scope="module")
def triton_client(service):
    with triton.InferenceServerClient(service.url.removeprefix("http://")) as c:
        yield c


def image_input(*images: Path, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array([p.read_bytes() for p in images], dtype=np.object_), binary_data=binary)
    return tensor


def test_tritonclient_reads_health_metadata_and_config(triton_client):
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    assert triton_client.is_model_ready(MODEL) and triton_client.is_model_ready(MODEL, "1")
    assert not triton_client.is_model_ready("no_such_model")
    meta = triton_client.get_model_metadata(MODEL)
    assert meta["inputs"] == [{"name": "image", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}]
    assert [o["name"] for o in meta["outputs"]] == ["scores", "raw"]
    assert triton_client.get_model_config(MODEL)["max_batch_size"] == 0
    server = triton_client.get_server_metadata()
    assert {"binary_tensor_data", "classification"} <= set(server["extensions"])


def test_tritonclient_binary_image_with_classification(triton_client, client, cat_png):
    expected = native_top5(client, cat_png)
    result = triton_client.infer(MODEL, [image_input(cat_png)],
                                 outputs=[triton.InferRequestedOutput("scores", class_count=5)])
    rows = result.as_numpy("scores")
    assert rows.shape == (1, 5)
    parsed = [e.decode().split(":", 2) for e in rows[0]]
    assert [int(index) for _, index, _ in parsed] == expected
    assert parsed[0][2] == "tiger cat"
    timings = result.get_response()["parameters"]
    assert timings["backend"] == "cpu" and timings["inference_ms"] > 0 and timings["decode_ms"] > 0


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_raw_tensor_json_and_binary(triton_client, client, cat_png, binary):
    tensor = triton.InferInput("image", [1, 224, 224, 3], "UINT8")
    tensor.set_data_from_numpy(pixels(cat_png), binary_data=binary)
    result = triton_client.infer(MODEL, [tensor], outputs=[triton.InferRequestedOutput("scores", binary_data=binary),
                                                           triton.InferRequestedOutput("raw", binary_data=True)])
    scores = result.as_numpy("scores")
    assert scores.dtype == np.float32 and scores.shape == (1, 1000)
    assert top5(scores[0]) == native_top5(client, cat_png)
    raw = result.as_numpy("raw")
    assert raw.dtype == np.uint8 and int(np.argmax(raw[0])) == top5(scores[0])[0]
    assert result.get_response()["parameters"]["decode_ms"] == 0


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_requests(triton_client, client, cat_png, algorithm):
    result = triton_client.infer(MODEL, [image_input(cat_png)], request_compression_algorithm=algorithm)
    assert top5(result.as_numpy("scores")[0]) == native_top5(client, cat_png)


def test_a_batch_runs_as_separate_invokes_answered_in_order(triton_client, client, cat_png, coffee_png):
    result = triton_client.infer(MODEL, [image_input(cat_png, coffee_png, cat_png)])
    scores = result.as_numpy("scores")
    assert scores.shape == (3, 1000)
    cat, coffee = native_top5(client, cat_png), native_top5(client, coffee_png)
    assert [top5(row) for row in scores] == [cat, coffee, cat]


def test_tritonclient_async_survives_errors(service, client, cat_png):
    async def scenario():
        async with triton_aio.InferenceServerClient(service.url.removeprefix("http://")) as c:
            wrong = triton_aio.InferInput("pixels", [1], "BYTES")
            wrong.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
            with pytest.raises(InferenceServerException, match="the model has one input, 'image'"):
                await c.infer(MODEL, [wrong])
            with pytest.raises(InferenceServerException, match="not an image"):
                await c.infer(MODEL, [image_input(Path(__file__))])
            with pytest.raises(InferenceServerException, match="no model 'nope'"):
                await c.infer("nope", [image_input(cat_png)])
            # the same connection pool still works after three errors
            results = await asyncio.gather(*(c.infer(MODEL, [image_input(cat_png)]) for _ in range(4)))
            return [top5(r.as_numpy("scores")[0]) for r in results]

    assert asyncio.run(scenario()) == [native_top5(client, cat_png)] * 4


@pytest.mark.parametrize("path, body, headers, status, message", [
    ("/v2/models/nope/infer", b"{}", {}, 404, "no model 'nope'"),
    (f"/v2/models/{MODEL}/versions/7/infer", b"{}", {}, 404, "no version '7'"),
    (f"/v2/models/{MODEL}/infer", b"{", {}, 400, "not valid JSON"),
    (f"/v2/models/{MODEL}/infer", b"\x1f\x8b garbage", {"content-encoding": "gzip"}, 400, "not valid gzip"),
    (f"/v2/models/{MODEL}/infer", b"{}", {"content-encoding": "br"}, 400, "'br' is not accepted"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 224, 224, 3],
                                                          "data": [0.0] * 150528}]}).encode(), {}, 400,
     "takes UINT8 tensors"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 2, 2, 3],
                                                          "data": [0] * 12}]}).encode(), {}, 400,
     r"shape must be \[N, 224, 224, 3\]"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [65],
                                                          "data": ["x"] * 65}]}).encode(), {}, 400, "at most 64"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                                          "data": ["x"]}], "parameters": {"backend": "gpu"}}).encode(),
     {}, 400, "backend 'gpu' is not loaded"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                                          "data": ["x"]}], "outputs": [{"name": "probs"}]}).encode(),
     {}, 400, "unknown output 'probs'"),
    (f"/v2/models/{MODEL}/infer", b"0" * (5 * 1024 * 1024), {}, 413, "limit"),
])
def test_errors_are_json_with_the_protocols_status(client, path, body, headers, status, message):
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}
    assert __import__("re").search(message, r.json()["error"])


def test_health_and_metadata_over_plain_http(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get(f"/v2/models/{MODEL}/ready").json() == {"name": MODEL, "ready": True}
    assert client.get(f"/v2/models/{MODEL}/versions/1").json()["versions"] == ["1"]
    assert client.get("/v2/models/nope").status_code == 404
    assert client.get("/v2/models/nope/ready").status_code == 404


def test_kserve_client_classifies_the_photo(service, client, cat_png):
    python = ensure_venv("kserve", ["kserve==0.21.0"], share=True)
    out = subprocess.run([str(python), str(KSERVE_SCRIPT), service.url, MODEL, str(cat_png)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["live"] and result["ready"] and result["model_ready"]
    assert result["top5"] == native_top5(client, cat_png)
