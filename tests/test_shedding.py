"""Load shedding from the request head: with the line full, the HTTP server itself answers an
inference request 503 as soon as its head is parsed, in the app's words, and counts it."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
from prometheus_client import REGISTRY

from app.api.held import ROOM_CHECKED
from app.api.shedding import HeadAdmission
from app.http_server import _Server, config
from app.api.routes import InferenceRoutes
from app.api.app import inference_routers
from app.main import create_app
from app.api.deps import service_of
from app.settings import Settings
from bench.service import free_port
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.test_http_server import closed_by_server, read_response
from tests.waiting import until

ANSWER_S = 10
# A request that runs the model: the emulated backend's first one loads and runs it cold (seconds, more under load)
RUN_S = 60


@pytest.fixture(scope="module")
def served():
    """The real server (our protocol, uvicorn, the app) on a thread, the line of 1 under the test's control.

    Admission by count only (MAX_QUEUE_MS 0): these tests fill the line on purpose, and after each refusal the
    pool stays overloaded for OVERLOAD_HOLD_S, when a line is bounded by time too; on a loaded machine the
    request that follows a refusal could then wait past MAX_QUEUE_MS and be refused by time (tests/test_admission.py
    tests that), which is not what this module is about."""
    settings = Settings(model_dir=MODELS, models=[DEFAULT_MODEL], backends=["cpu", "emulated"], workers=1,
                        max_waiting=0, max_queue_ms=0, retry_after_s=2, warmup_at_start=False, host="127.0.0.1",
                        port=free_port())
    app = create_app(settings)
    server = _Server(config(app, settings))  # the head check comes from the app's lifespan
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    until(ready, 60, "the server ready", poll_s=0.05)
    try:
        yield settings.port, service_of(app).registry, service_of(app).core
    finally:
        server.should_exit = True
        thread.join(ANSWER_S)


def head_only(port: int, target: str, length: int = 1000) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
    sock.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {length}\r\n\r\n"
                 .encode())
    return sock


def refused(protocol: str, backend: str = "cpu") -> float:
    labels = {"protocol": protocol, "task": "classification", "model": DEFAULT_MODEL, "backend": backend,
              "status": "503"}
    return REGISTRY.get_sample_value("edgetpu_serve_requests_total", labels) or 0.0


@pytest.mark.parametrize("target,protocol", [
    ("/v1/classify?top_k=3", "v1"),
    (f"/v1/models/{DEFAULT_MODEL}/classify", "v1"),
    (f"/v2/models/{DEFAULT_MODEL}/infer", "v2"),
    (f"/v2/models/{DEFAULT_MODEL}/versions/1/infer", "v2"),
])
def test_a_full_line_is_answered_from_the_head_without_a_byte_of_body(served, target, protocol):
    port, registry, _ = served
    place = registry.get(DEFAULT_MODEL).pool("cpu").admit()  # the line of 1 is full
    before = refused(protocol)
    try:
        sock = head_only(port, target)
        status, headers, body = read_response(sock)
        assert status == 503 and headers["retry-after"] == "2" and headers["connection"] == "close"
        assert "all 1 interpreters busy" in body["error"] and DEFAULT_MODEL in body["error"]
        assert closed_by_server(sock, ANSWER_S)
        sock.close()
        assert refused(protocol) == before + 1  # counted like any other answer
    finally:
        place.release()


def test_only_the_full_line_is_refused(served, cat_png):
    port, registry, _ = served
    url = f"http://127.0.0.1:{port}"
    place = registry.get(DEFAULT_MODEL).pool("cpu").admit()
    try:
        assert httpx.get(f"{url}/healthz").status_code == 200  # not an inference route
        other = httpx.post(f"{url}/v1/classify?backend=emulated", content=cat_png.read_bytes(),
                           headers={"content-type": "image/png"}, timeout=RUN_S)
        assert other.status_code == 200, other.text  # another backend's line has room
        unknown = httpx.post(f"{url}/v1/models/nope/classify", content=b"x", headers={"content-type": "image/png"})
        assert unknown.status_code == 404  # not placed: the application answers as ever
    finally:
        place.release()
    r = httpx.post(f"{url}/v1/classify", content=cat_png.read_bytes(), headers={"content-type": "image/png"},
                   timeout=RUN_S)
    assert r.status_code == 200, r.text


def test_head_admission_places_a_request_as_the_application_would(served):
    _, registry, core = served
    check = HeadAdmission(core, InferenceRoutes.of(inference_routers()))
    place = registry.get(DEFAULT_MODEL).pool("cpu").admit()
    try:
        assert check(b"POST", b"/v1/classify").status == 503
        assert check(b"POST", b"/v1/classify?backend=cpu&top_k=2").status == 503
        # that line has room: the request goes on, its scope saying it was checked (the app does not check again)
        assert check(b"POST", b"/v1/classify?top_k=2&backend=emulated") == {ROOM_CHECKED: True}
        assert check(b"GET", b"/v1/classify") is None
        assert check(b"POST", b"/v1/classify/extra") is None
        assert check(b"POST", b"/v1/models/eff%69cientnet_lite0/classify") is None  # encoded: the app decodes it
        assert check(b"POST", b"/v1/classify?backend=nope") is None  # the app's 422
        # the last one counts; a key decoded as the app does
        assert check(b"POST", b"/v1/classify?backend=cpu&backend=emulated") == {ROOM_CHECKED: True}
        assert check(b"POST", b"/v1/classify?back%65nd=emulated") == {ROOM_CHECKED: True}
        assert check(b"POST", f"/v2/models/{DEFAULT_MODEL}/versions/9/infer".encode()) is None  # the app's 404
    finally:
        place.release()
    assert check(b"POST", b"/v1/classify") == {ROOM_CHECKED: True}


def test_a_pipelined_request_is_left_to_the_application_which_answers_in_order(served, cat_png):
    port, registry, _ = served
    data = cat_png.read_bytes()
    place = registry.get(DEFAULT_MODEL).pool("cpu").admit()  # cpu's line full, emulated's free
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
        head = "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n"
        sock.sendall(head.format("/v1/classify?backend=emulated", len(data)).encode() + data
                     + head.format("/v1/classify", len(data)).encode() + data)
        answers = responses(sock, 2)
        assert answers[0][0] == 200 and answers[0][1]["backend"] == "emulated", answers  # not replaced by the 503
        assert answers[1][0] == 503 and "busy" in answers[1][1]["error"], answers
        sock.close()
    finally:
        place.release()


def responses(sock: socket.socket, count: int) -> list[tuple[int, dict]]:
    """`count` responses read off one connection in order (status, JSON body), each by its Content-Length."""
    data, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "content-length")
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed mid-body"
            data += chunk
        out.append((int(lines[0].split()[1]), json.loads(data[:length])))
        data = data[length:]
    return out
