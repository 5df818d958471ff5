"""Every way of starting the service either holds the HTTP limits or refuses, saying how to start it
(app/launch.py). The limits under each supported launch: tests/test_http_server.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from app.launch import CANNOT_START
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
    monkeypatch.setattr(launch, "THIS_PROCESS", launch.ThisProcess())
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



# ---- a wrong setting stops every launch in one line ---------------------------------------------------

WRONG_SETTINGS = {  # launch -> (its command, a wrong setting of each kind, what its line must say)
    "python -m app": ([sys.executable, "-m", "app"], {"EDGETPU_SERVE_PORT": "eighty"},
                      "EDGETPU_SERVE_PORT='eighty': input should be a valid integer"),
    "python -m app, several processes": (
        [sys.executable, "-m", "app"], {"EDGETPU_SERVE_PROCESSES": "2", "EDGETPU_SERVE_EDGETPU_ON_FAILURE": "maybe"},
        "EDGETPU_SERVE_EDGETPU_ON_FAILURE='maybe': input should be 'fail' or 'fallback'"),
    "uvicorn app.launch:Protocol": ([*UVICORN, "--http", "app.launch:Protocol", "app.main:app"],
                                    {"EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT": "10"},
                                    "EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT=10 must be at least twice "
                                    "EDGETPU_SERVE_MAX_BODY_BYTES"),
    "uvicorn app.launch:Protocol --factory": (
        [*UVICORN, "--http", "app.launch:Protocol", "--factory", "app.main:create_app"],
        {"EDGETPU_SERVE_PLUGINS": "{not json"}, "EDGETPU_SERVE_PLUGINS='{not json': not the JSON this setting takes"),
    "uvicorn app.main:app": ([*UVICORN, "app.main:app"], {"EDGETPU_SERVE_LOG_LEVEL": "loud"},
                             "EDGETPU_SERVE_LOG_LEVEL='loud': input should be 'critical'"),
    "gunicorn -c python:app.gunicorn_conf": (
        [*GUNICORN, "-c", "python:app.gunicorn_conf", "app.main:app"], {"EDGETPU_SERVE_DEVICE_SHARE": "1/2"},
        "EDGETPU_SERVE_DEVICE_SHARE=1/2 needs EDGETPU_SERVE_DEVICE_CLAIMS_DIR"),
    "gunicorn -k LimitedUvicornWorker": (
        [*GUNICORN, "-k", "app.gunicorn_worker.LimitedUvicornWorker", "--workers", "1", "app.main:app"],
        {"EDGETPU_SERVE_BACKENDS": "cpu,tpu"}, "EDGETPU_SERVE_BACKENDS='cpu,tpu': no backend tpu here"),
}


@pytest.mark.parametrize("launch", list(WRONG_SETTINGS))
def test_a_wrong_setting_stops_every_launch_with_one_line_naming_it(launch):
    argv, wrong, said = WRONG_SETTINGS[launch]
    port = free_port()
    env = {**os.environ, **ENV, "EDGETPU_SERVE_PORT": str(port), **wrong}
    done = subprocess.run([arg.format(port=port) for arg in argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    # python -m app's own refusal status; the servers' "app failed to load"
    assert done.returncode == (2 if launch.startswith("python -m app") else CANNOT_START), output
    (line,) = [line for line in output.splitlines() if "edgetpu-serve" in line]
    assert line.startswith("edgetpu-serve: cannot start: ") and said in line and "Fix: " in line, output
    assert "Traceback" not in output and "validation error" not in output, output
    assert "Application startup complete" not in output, output


def refusal_for(monkeypatch, **variables: str) -> str:
    from app.launch import SettingsRefused, settings_from_environment

    for name in [n for n in os.environ if n.startswith("EDGETPU_SERVE_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsRefused) as refused:
        settings_from_environment()
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("variables, expected", [
    ({"EDGETPU_SERVE_PORT": "-1"}, "EDGETPU_SERVE_PORT='-1': input should be greater than or equal to 0. Fix: correct "
                                   "EDGETPU_SERVE_PORT, or unset it (default: 8000)"),
    # a union: each of its forms said
    ({"EDGETPU_SERVE_PROCESSES": "many"}, "EDGETPU_SERVE_PROCESSES='many': input should be a valid integer, unable to "
                                          "parse string as an integer, or input should be 'auto'. Fix: correct "
                                          "EDGETPU_SERVE_PROCESSES, or unset it (default: auto)"),
    # a field validator's own words
    ({"EDGETPU_SERVE_DEVICE_SHARE": "half"}, "EDGETPU_SERVE_DEVICE_SHARE='half': 'half': a share is K/N, the K-th of N "
                                             "(0-based), e.g. 0/2. Fix: correct EDGETPU_SERVE_DEVICE_SHARE, or unset it "
                                             "(default: unset)"),
    # JSON pydantic-settings could not read: no ValidationError, the field named in its message only
    ({"EDGETPU_SERVE_PLUGINS": "[1"}, "EDGETPU_SERVE_PLUGINS='[1': not the JSON this setting takes ("),
    # a check across settings (a model validator) that names its setting by its short name: the prefix added
    ({"EDGETPU_SERVE_ZMQ_ENDPOINT": "tcp://0.0.0.0:5555"}, "EDGETPU_SERVE_ZMQ_ENDPOINT='tcp://0.0.0.0:5555' binds"),
    # a plug-in's setting, under the variable it was given by (one that kept its first name too)
    ({"EDGETPU_SERVE_EDGETPU_PERFORMANCE": "turbo"}, "EDGETPU_SERVE_EDGETPU_PERFORMANCE='turbo': input should be "),
    ({"EDGETPU_SERVE_EDGETPU_TEMPERATURE_WARN_CELSIUS": "0"}, "EDGETPU_SERVE_EDGETPU_TEMPERATURE_WARN_CELSIUS='0': "
                                                              "input should be greater than 0"),
    ({"EDGETPU_SERVE_BACKENDS": "cpu,coral"}, "EDGETPU_SERVE_BACKENDS='cpu,coral': no backend coral here. Fix: name "
                                              "backends among cpu, edgetpu, emulated"),
])
def test_a_wrong_setting_is_said_in_one_line_with_its_variable_and_the_fix(monkeypatch, variables, expected):
    assert refusal_for(monkeypatch, **variables).startswith(expected)


def test_every_wrong_setting_is_said_and_no_key_is_shown(monkeypatch):
    message = refusal_for(monkeypatch, EDGETPU_SERVE_PORT="x", EDGETPU_SERVE_WORKERS="0",
                          EDGETPU_SERVE_API_KEYS_FILE="", EDGETPU_SERVE_ADMIN_KEYS="secret-admin-key",
                          EDGETPU_SERVE_MAX_HEADER_BYTES="10", EDGETPU_SERVE_EDGETPU_ON_FAILURE="never")
    assert message.count("Fix: ") == 4 and "; " in message
    for variable in ("EDGETPU_SERVE_PORT=", "EDGETPU_SERVE_WORKERS=", "EDGETPU_SERVE_MAX_HEADER_BYTES=",
                     "EDGETPU_SERVE_EDGETPU_ON_FAILURE="):
        assert variable in message
    assert "secret-admin-key" not in message  # the keys are valid here; a wrong one is not repeated either


def test_a_key_that_is_wrong_is_named_but_not_repeated():
    from pydantic import Field, ValidationError
    from pydantic_settings import BaseSettings, SettingsConfigDict

    from app.settings import settings_problem

    class Keyed(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="EDGETPU_SERVE_")
        key: int = Field(default=0, repr=False)

    with pytest.raises(ValidationError) as wrong:
        Keyed(key="hunter2")
    message = settings_problem(wrong.value, Keyed)
    assert message.startswith("EDGETPU_SERVE_KEY: input should be a valid integer") and "hunter2" not in message
