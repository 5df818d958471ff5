"""Every way of starting the service either holds the HTTP limits or refuses, saying how to start it
(app/launch.py). The limits under each supported launch: tests/test_http_server.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from bench.service import ROOT, free_port
from tests.conftest import Service
from tests.test_http_server import read_response
from tests.waiting import until

ENV = {"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist"}
REFUSAL_TIMEOUT_S = 60  # importing and building the app on a loaded machine; a refusal needs no more
UVICORN = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", "{port}"]
# no control socket: gunicorn 27 would put one in ~/.gunicorn, shared by every test's gunicorn
GUNICORN = [sys.executable, "-m", "gunicorn", "--no-control-socket", "--bind", "127.0.0.1:{port}"]

REFUSED = {
    "uvicorn app.main:app": [*UVICORN, "app.main:app"],
    "uvicorn --factory app.main:create_app": [*UVICORN, "--factory", "app.main:create_app"],
    "uvicorn --http httptools app.main:app": [*UVICORN, "--http", "httptools", "app.main:app"],
    "gunicorn with uvicorn's own worker": [*GUNICORN, "-k", "uvicorn_worker.UvicornWorker", "app.main:app"],
    "gunicorn factory with uvicorn's own worker": [*GUNICORN, "-k", "uvicorn_worker.UvicornWorker",
                                                   "app.main:create_app()"],
    "gunicorn's own ASGI worker": [*GUNICORN, "-k", "asgi", "app.main:app"],
    "gunicorn with two of our workers": [*GUNICORN, "-k", "app.gunicorn_worker.LimitedUvicornWorker",
                                         "--workers", "2", "app.main:app"],
}


@pytest.mark.parametrize("argv", list(REFUSED.values()), ids=list(REFUSED))
def test_a_launch_that_cannot_hold_the_limits_refuses_and_says_how_to_start(argv):
    port = free_port()
    env = {**os.environ, **ENV, "EDGETPU_SERVE_PORT": str(port)}
    done = subprocess.run([arg.format(port=port) for arg in argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "edgetpu-serve: refusing to start" in output, output
    for how in ("python -m app", "uvicorn --http app.launch:Protocol app.main:app",
                "gunicorn -c python:app.gunicorn_conf"):
        assert how in output
    assert "Application startup complete" not in output


@pytest.mark.parametrize("launch", ["uvicorn app.main:app", "uvicorn --factory app.main:create_app"])
def test_a_refusal_is_its_message_alone_then_a_failed_exit(launch):
    """The refusal fails the startup through the ASGI lifespan protocol: uvicorn prints no traceback after it."""
    port = free_port()
    env = {**os.environ, **ENV, "EDGETPU_SERVE_PORT": str(port)}
    done = subprocess.run([arg.format(port=port) for arg in REFUSED[launch]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output  # uvicorn's failed startup
    assert output.count("edgetpu-serve: refusing to start") == 1, output
    assert "Traceback" not in output and "LaunchRefused" not in output, output
    assert output.rstrip().endswith("Application startup failed. Exiting."), output


def test_uvicorn_factory_with_our_protocol_holds_the_head_cap():
    """The factory form of the supported uvicorn launch (the full hostile set runs on app.main:app)."""
    port = free_port()
    argv = [arg.format(port=port) for arg in UVICORN] + ["--http", "app.launch:Protocol", "--factory",
                                                         "app.main:create_app"]
    with Service(ENV, argv=argv, port=port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bomb: " + b"a" * (64 * 1024) + b"\r\n\r\n")
            status, headers, body = read_response(s)
    assert status == 431 and headers["content-type"] == "application/json"
    assert body == {"error": "request line and headers exceed 16384 bytes"}


def test_an_app_built_for_another_server_is_built_once_and_refuses_at_its_lifespan(monkeypatch):
    """uvicorn looks `app.main:app` up twice (a check, then the load): one app, one registry."""
    from fastapi.testclient import TestClient

    from app import launch, main

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(launch, "_built", {})
    monkeypatch.setattr(launch, "_protocol_in_use", False)
    app = main.app
    assert main.app is app
    with pytest.raises(launch.LaunchRefused):
        with TestClient(app):
            pass
    launch.mark_protocol_in_use()
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200


def test_our_protocol_under_an_app_that_sets_no_limits_applies_those_of_the_environment(monkeypatch):
    """A lifespan that hands over no limits (another app, or `--lifespan off`): the protocol still caps heads."""
    import threading

    import uvicorn

    from app.http_server import LimitedHttpToolsProtocol

    monkeypatch.setenv("EDGETPU_SERVE_MAX_HEADER_BYTES", "4096")

    async def plain_app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"{}"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(plain_app, host="127.0.0.1", port=port, http=LimitedHttpToolsProtocol,
                                           lifespan="off", log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        def started() -> bool:
            assert thread.is_alive(), "the server's thread ended"
            return server.started
        until(started, 30, "the server started")
        answers = []
        for size in (1000, 5000):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"f" * size + b"\r\n\r\n")
                answers.append(read_response(s)[0])
        assert answers == [200, 431]
    finally:
        server.should_exit = True
        thread.join(10)

