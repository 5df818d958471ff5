"""Hostile and broken clients against the real server over loopback sockets, under each launch the
service supports (python -m app, uvicorn's command line, gunicorn: app/launch.py): header bombs, slow
heads and bodies, too many connections, malformed HTTP, the body budget."""

import json
import signal
import socket
import sys
import threading
import time

import httpx
import pytest

from bench.service import free_port
from tests.conftest import Service
from tests.contracts import changed_methods
from tests.waiting import refuses_connections, until

HEAD_CAP = 16 * 1024
DEADLINE_S = 0.6
MAX_CONNECTIONS = 12
BODY_LIMIT = 1024 * 1024
# Upper bounds here prove that the server answers or closes by itself (without its limits it would wait for ever),
# not how fast: a loaded 2-core CI machine can lag by seconds, and bench/hostile.py measures the speed.
SLACK_S = 5.0


# Every supported launch, as a user types it ({port}: the test's free port). Settings from EDGETPU_SERVE_*.
LAUNCHES = {
    "python -m app": [sys.executable, "-m", "app"],
    "uvicorn --http app.launch:Protocol": [sys.executable, "-m", "uvicorn", "--http", "app.launch:Protocol",
                                           "app.main:app", "--host", "127.0.0.1", "--port", "{port}",
                                           "--no-access-log"],
    "gunicorn -k LimitedUvicornWorker": [sys.executable, "-m", "gunicorn", "--no-control-socket",
                                         "-k", "app.gunicorn_worker.LimitedUvicornWorker",
                                         "--workers", "1", "--bind", "127.0.0.1:{port}", "app.main:app"],
    # the service's gunicorn configuration: PROCESSES workers (auto, on the cpu: one), the group's hooks
    "gunicorn -c python:app.gunicorn_conf": [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf",
                                             "--bind", "127.0.0.1:{port}", "app.main:app"],
}


def launched(launch: str, env: dict[str, str]) -> Service:
    port = free_port()
    argv = [arg.format(port=port) for arg in LAUNCHES[launch]]
    return Service(env, argv=argv, port=port)


@pytest.fixture(scope="module", params=list(LAUNCHES))
def server(request):
    svc = launched(request.param, {
        "EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
        "EDGETPU_SERVE_HEADER_TIMEOUT_S": str(DEADLINE_S), "EDGETPU_SERVE_BODY_TIMEOUT_S": str(DEADLINE_S),
        "EDGETPU_SERVE_KEEP_ALIVE_TIMEOUT_S": "0.5", "EDGETPU_SERVE_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "EDGETPU_SERVE_MAX_BODY_BYTES": str(BODY_LIMIT),
        "EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT": str(2 * BODY_LIMIT), "EDGETPU_SERVE_WAIT_TIMEOUT_S": "0.2",
    })
    svc.wait_ready()
    yield svc
    svc.stop()


def connect(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return s


def read_response(s: socket.socket) -> tuple[int, dict, dict | None]:
    """Status, headers, JSON body of one response, reading until the body is complete or EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, json.loads(body) if body else None


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_one_mib_header_gets_a_fast_431_while_others_are_served(server):
    healthz = []

    def other_client():
        with httpx.Client(base_url=server.url, timeout=5) as c:
            for _ in range(20):
                start = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                healthz.append(time.perf_counter() - start)

    other = threading.Thread(target=other_client)
    other.start()
    s = connect(server)
    start = time.perf_counter()
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bomb: " + b"a" * (1 << 20) + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before it had all of it
    status, headers, body = read_response(s)
    elapsed = time.perf_counter() - start
    other.join()
    assert status == 431 and headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert body == {"error": f"request line and headers exceed {HEAD_CAP} bytes"}
    assert elapsed < SLACK_S  # answered without reading the whole megabyte
    assert len(healthz) == 20


@pytest.mark.parametrize("size, status", [(HEAD_CAP - 512, 200), (HEAD_CAP + 1, 431)])
def test_the_head_cap_counts_request_line_and_headers(server, size, status):
    s = connect(server)
    header = b"X-Fill: " + b"f" * (size - 60) + b"\r\n"  # ~60 bytes of request line and Host
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header + b"\r\n")
    assert read_response(s)[0] == status


def test_many_small_headers_are_capped_too(server):
    s = connect(server)
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(400))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert read_response(s)[0] == 431


def test_a_head_that_trickles_in_gets_408_at_its_deadline(server):
    s = connect(server)
    start = time.perf_counter()
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
    status, _, body = read_response(s)
    elapsed = time.perf_counter() - start
    assert status == 408 and body == {"error": f"request headers not received within {DEADLINE_S:g} s"}
    assert DEADLINE_S * 0.9 < elapsed < DEADLINE_S + SLACK_S  # not before the deadline
    assert closed_by_server(s, 3)


def test_a_silent_connection_is_dropped_at_the_header_deadline(server):
    s = connect(server)
    assert read_response(s)[0] == 408
    assert closed_by_server(s, 3)


def test_a_body_that_trickles_in_gets_408_at_its_deadline(server):
    s = connect(server)
    s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 5000\r\n\r\n")
    start = time.perf_counter()
    s.sendall(b"\x89PNG")
    status, _, body = read_response(s)
    assert status == 408 and body == {"error": f"request body not received within {DEADLINE_S:g} s"}
    assert time.perf_counter() - start < DEADLINE_S + SLACK_S
    assert closed_by_server(s, 3)
    # the service is fine afterwards
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_beyond_the_connection_cap_a_fast_503_in_json(server):
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]

    def one_more():
        s = connect(server)
        start = time.perf_counter()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_response(s)
        elapsed = time.perf_counter() - start
        s.close()
        return (status, headers, body, elapsed) if status == 503 else None

    try:
        # asked again until the server has taken every held connection
        status, headers, body, elapsed = until(one_more, SLACK_S, "a 503 beyond the held connections", poll_s=0.05)
        assert status == 503 and headers["retry-after"] == "1"
        assert "too many open connections" in body["error"]
        assert elapsed < SLACK_S  # answered at once, not after the held connections' deadlines
    finally:
        for h in held:
            h.close()
    until(lambda: httpx.get(f"{server.url}/healthz").status_code == 200, SLACK_S, "the closed connections' room back")


@pytest.mark.parametrize("request_bytes, reason", [
    (b"GARBAGE\r\n\r\n", "Invalid method"),
    (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
     "Content-Length"),
    (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "content-length"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n", "header"),
])
def test_malformed_http_gets_a_json_400(server, request_bytes, reason):
    s = connect(server)
    s.sendall(request_bytes)
    status, headers, body = read_response(s)
    assert status == 400 and headers["content-type"] == "application/json"
    assert body["error"].startswith("malformed HTTP request: ") and reason.lower() in body["error"].lower()


def test_keep_alive_connections_close_after_their_idle_timeout(server):
    s = connect(server)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[0] == 200
    start = time.perf_counter()
    assert closed_by_server(s, 3)
    assert time.perf_counter() - start > 0.4  # not before its idle timeout


def test_keep_alive_requests_each_get_their_own_head_deadline(server):
    s = connect(server)
    for _ in range(3):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 200
        time.sleep(DEADLINE_S * 0.6)  # simulates a slow client: each pause under the deadline, together over it


def test_bodies_beyond_the_memory_budget_wait_then_get_503(server):
    # Two slow clients each hold a full body's reservation (the budget is two bodies) ...
    holders = []
    for _ in range(2):
        h = connect(server)
        h.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                  b"Content-Length: %d\r\n\r\n\x89PNG" % BODY_LIMIT)
        holders.append(h)
    # ... so a third body waits for memory (WAIT_TIMEOUT_S 0.2, under the body deadline) and is turned away with
    # Retry-After. Asked again while the holders' heads are still on their way in: on a loaded machine their
    # reservations may come after the first ask.
    def third():
        r = httpx.post(f"{server.url}/v1/classify", content=b"\x89PNG" + b"0" * 1000,
                       headers={"content-type": "image/png"}, timeout=10)
        return r if r.status_code == 503 and "memory budget" in r.json()["error"] else None

    r = until(third, SLACK_S, "a third body turned away for want of memory", poll_s=0.05)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "memory budget" in r.json()["error"]
    for h in holders:
        assert read_response(h)[0] == 408  # the body deadline ends them and frees their reservations
    for _ in range(10):  # admitted now (a bounded few asks: WAIT_TIMEOUT_S 0.2 is short for a loaded machine)
        r = httpx.post(f"{server.url}/v1/classify", content=b"\x89PNG" + b"0" * 1000,
                       headers={"content-type": "image/png"}, timeout=10)
        if r.status_code != 503:
            break
    assert r.status_code == 400, r.text  # not a PNG after its signature


def test_sigterm_lets_requests_in_flight_finish(cat_png):
    """Graceful shutdown through our protocol: 8 requests mid-body at SIGTERM all complete."""
    svc = Service({"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist"})
    svc.wait_ready()
    image = cat_png.read_bytes()
    clients = []
    try:
        for _ in range(8):
            s = connect(svc)
            s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(image) + image[:1000])
            clients.append(s)
        # a request on a connection made after theirs is answered after their heads were read: mid-body now
        assert httpx.get(f"{svc.url}/healthz").status_code == 200
        svc.process.terminate()
        until(lambda: refuses_connections(svc.port), SLACK_S, "the service shutting down (no longer accepting)")
        for s in clients:
            s.sendall(image[1000:])
        statuses = [read_response(s)[0] for s in clients]
        assert statuses == [200] * 8
        # uvicorn re-raises the signal once it has drained, so the exit status is "killed by SIGTERM"
        assert svc.process.wait(10) in (0, -signal.SIGTERM)
    finally:
        svc.stop()


def test_the_linger_of_a_refused_connection_is_a_setting():
    from app.http_server import HttpLimits
    from app.settings import Settings

    assert HttpLimits.from_settings(Settings(linger_s=0.25)).linger_s == 0.25


# ---- what app/http_server.py relies on in uvicorn ------------------------------------------------------------
# Beyond uvicorn's public configuration (uvicorn.Config's options, uvicorn.Server), app/http_server.py subclasses
# uvicorn's httptools protocol, since uvicorn has no public hook for a head cap, head and body deadlines or a check
# of the head. This is all it relies on there: each method it overrides or calls with the parameters it passes,
# and each attribute it reads or sets. uvicorn is pinned to the minor version this was read from (pyproject.toml);
# a release that changes one of them fails here first, by name, before any behaviour test above does.
PROTOCOL_METHODS = {  # uvicorn.protocols.http.httptools_impl.HttpToolsProtocol: method -> its parameters
    "__init__": "config, server_state, app_state, _loop=None",  # overridden, called with all four
    "connection_made": "transport",  # overridden, each calling uvicorn's
    "connection_lost": "exc",
    "on_message_begin": "",  # httptools' parser callbacks, as uvicorn implements them
    "on_url": "url",
    "on_header": "name, value",
    "on_headers_complete": "",
    "on_body": "body",
    "on_message_complete": "",
    "on_response_complete": "",
    "send_400_response": "msg",  # overridden: JSON instead of text
    "data_received": "data",  # replaced (a parser error's reason goes into the 400), doing what uvicorn's does:
    "handle_websocket_upgrade": "",
    "_unset_keepalive_if_required": "",  # private
    "_should_upgrade": "",  # private
    "_unsupported_upgrade_warning": "",  # private
}
# attributes of the protocol, and of its RequestResponseCycle (`cycle`), read or set
PROTOCOL_ATTRIBUTES = ("parser", "cycle", "url", "scope", "connections", "transport", "flow", "loop", "client",
                       "timeout_keep_alive")
CYCLE_ATTRIBUTES = ("receive", "response_complete", "response_started", "disconnected", "message_event")
SERVER_METHODS = {"handle_exit": "sig, frame"}  # uvicorn.Server, subclassed: a second SIGTERM ends the drain
SERVER_ATTRIBUTES = ("should_exit", "force_exit", "started")


class _Transport:
    """Enough of an asyncio transport for uvicorn's protocol to take one request head."""

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data):
        pass

    def is_closing(self):
        return False

    def close(self):
        pass

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def test_the_uvicorn_internals_the_protocol_relies_on_are_there():
    import asyncio

    import uvicorn
    from uvicorn.protocols.http import httptools_impl
    from uvicorn.server import ServerState

    from app.http_server import LimitedHttpToolsProtocol

    changed = changed_methods(httptools_impl.HttpToolsProtocol, PROTOCOL_METHODS) + \
        changed_methods(uvicorn.Server, SERVER_METHODS)
    status_line = getattr(httptools_impl, "STATUS_LINE", None)
    if not isinstance(status_line, dict) or not status_line.get(431, b"").startswith(b"HTTP/1.1 431 "):
        changed.append("httptools_impl.STATUS_LINE is no longer {status: b'HTTP/1.1 <status> <reason>\\r\\n'}")

    async def app(scope, receive, send):
        pass

    # uvicorn's own protocol, as it stands after one request's head
    loop = asyncio.new_event_loop()
    try:
        protocol = httptools_impl.HttpToolsProtocol(uvicorn.Config(app, log_level="warning"), ServerState(), {},
                                                    _loop=loop)
        protocol.connection_made(_Transport())
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n")
        changed += [f"HttpToolsProtocol().{name} is gone" for name in PROTOCOL_ATTRIBUTES
                    if not hasattr(protocol, name)]
        changed += [f"HttpToolsProtocol().cycle.{name} is gone" for name in CYCLE_ATTRIBUTES
                    if not hasattr(protocol.cycle, name)]
        for task in protocol.tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*protocol.tasks, return_exceptions=True))
    finally:
        loop.close()
    server = uvicorn.Server(uvicorn.Config(app))
    changed += [f"uvicorn.Server().{name} is gone" for name in SERVER_ATTRIBUTES if not hasattr(server, name)]
    assert not changed, f"uvicorn {uvicorn.__version__} changed what app/http_server.py relies on:\n  " + \
        "\n  ".join(changed)
    # and the list is complete: every method our protocol overrides is in it
    overridden = {name for name, value in vars(LimitedHttpToolsProtocol).items()
                  if callable(value) and hasattr(httptools_impl.HttpToolsProtocol, name)}
    assert overridden <= set(PROTOCOL_METHODS)
