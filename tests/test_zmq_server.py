"""app/frontdoors/zmq_server.py, the ZMQ door's socket, with a handler double that echoes: ipc endpoints (a live
process's socket refused, a stale one replaced, a file that is no socket left alone, the directories made for a bind
that fails removed, the socket removed at stop, abstract sockets), who may connect (PeerPolicy) and the accept path,
and Frigate's real client (pyzmq's REQ) and a DEALER over tcp and ipc.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading

import pytest
import uvloop
import zmq

from app.frontdoors.zmq_listen import peer_of
from app.frontdoors.zmq_server import BindError, Connection, PeerPolicy, ZmtpServer
from app.frontdoors.zmtp import ReaderLimits
from app.refusal_log import RefusalLog
from app.settings import zmq_endpoint
from bench.service import free_port

TIMEOUT_MS = 30_000
# The service runs on uvloop (uvicorn's loop="auto"); the door works on asyncio's own loop too
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def run(coroutine, loop: str = "uvloop"):
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(coroutine)


class EchoHandler:
    """TEST DOUBLE of the door: every frame held up to 1 MiB, each message answered with its frames reversed."""

    def __init__(self):
        self.lost = 0

    def frame_limit(self, peer, frames, size):
        return 1 << 20

    def message(self, peer, frames):
        envelope = [frames[0]] if frames and not len(frames[0]) else []
        peer.send(envelope + [bytes(f) for f in reversed(frames[len(envelope):])])

    def refused_message(self, peer, frames, dropped):
        return None

    def peer_lost(self, peer):
        self.lost += 1


def server(endpoint: str, policy: PeerPolicy = PeerPolicy(), **options) -> ZmtpServer:
    import logging

    return ZmtpServer(zmq_endpoint(endpoint), EchoHandler(), policy, max_connections=options.get("connections", 8),
                      timeout_s=10, limits=ReaderLimits(), refusals=RefusalLog(logging.getLogger("test.zmq"), 10))


def ask(endpoint: str, kind=zmq.REQ) -> list[bytes]:
    with zmq.Context() as context, context.socket(kind) as sock:
        sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart(([b""] if kind == zmq.DEALER else []) + [b"one", b"two", bytes(300_000)])
        return sock.recv_multipart()


async def serving(endpoint: str, policy: PeerPolicy = PeerPolicy(), kinds=(zmq.REQ, zmq.DEALER)) -> list:
    door = server(endpoint, policy)
    await door.start()
    try:
        return [await asyncio.to_thread(ask, endpoint, kind) for kind in kinds]
    finally:
        await door.stop()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_frigates_req_socket_and_a_dealer_are_answered(tmp_path, scheme, loop):
    endpoint = f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp" else f"ipc://{tmp_path}/door"
    req, dealer = run(serving(endpoint), loop)
    assert req == [bytes(300_000), b"two", b"one"]
    assert dealer == [b"", bytes(300_000), b"two", b"one"]
    if scheme == "ipc":
        assert not (tmp_path / "door").exists()  # removed at stop: it was ours


def test_an_ipc_socket_a_live_process_serves_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "held"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen()
    try:
        with pytest.raises(BindError, match="another live process serves"):
            run(serving(f"ipc://{path}"))
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # still the other's
        probe.close()
    finally:
        other.close()


def test_a_stale_ipc_socket_is_replaced(tmp_path):
    path = tmp_path / "stale"
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone.bind(str(path))
    gone.close()  # its file stays, nobody listens
    assert path.exists()
    req, = run(serving(f"ipc://{path}", kinds=(zmq.REQ,)))
    assert req[-1] == b"one"


def test_a_file_that_is_no_socket_is_not_replaced(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(BindError, match="exists and is not a socket"):
        run(serving(f"ipc://{path}"))
    assert path.read_text() == "mine"


def test_the_directories_made_for_a_bind_that_fails_are_removed(tmp_path):
    path = tmp_path / "made" / "for" / ("x" * 120)  # longer than a unix socket's path may be: the bind fails
    with pytest.raises(BindError):
        run(serving(f"ipc://{path}"))
    assert not (tmp_path / "made").exists()


@pytest.mark.parametrize("loop", LOOPS)
def test_an_abstract_ipc_socket_serves_where_allowed(tmp_path, loop):
    name = f"edgetpu-serve-test-{os.getpid()}"
    req, = run(serving(f"ipc://@{name}", kinds=(zmq.REQ,)), loop)
    assert req[-1] == b"one"


def test_who_may_connect_and_who_may_upload():
    policy = PeerPolicy.from_settings(["192.168.1.0/24", "fd00::5"], ["192.168.1.20"], anyone=False)
    address = ipaddress.ip_address
    assert policy.admits(address("127.0.0.1")) and policy.admits(address("::1")) and policy.admits(None)  # ipc
    assert policy.admits(address("192.168.1.77")) and policy.admits(address("fd00::5"))
    assert not policy.admits(address("192.168.2.1")) and not policy.admits(address("10.0.0.1"))
    assert policy.uploads(address("192.168.1.20")) and policy.uploads(address("127.0.0.1")) and policy.uploads(None)
    assert not policy.uploads(address("192.168.1.77"))
    assert PeerPolicy(anyone=True).admits(address("203.0.113.9"))
    assert not PeerPolicy(anyone=True).uploads(address("203.0.113.9"))


def test_a_connection_from_an_address_not_allowed_is_refused_before_its_transport_is_made():
    async def main():
        door = server("tcp://0.0.0.0:5555", PeerPolicy.from_settings(["192.168.1.0/24"], [], anyone=False))
        outsider = Connection(door, *peer_of(None, ("10.1.2.3", 4000)))
        insider = Connection(door, *peer_of(None, ("::ffff:192.168.1.9", 4001, 0, 0)))
        return door, door.admit(outsider), door.admit(insider), insider

    door, outsider, insider, peer = run(main())
    assert not outsider and door.dropped == 1
    assert insider and door.connections == {peer}
    assert peer.name == "192.168.1.9:4001" and peer.address == ipaddress.ip_address("192.168.1.9")
    assert not peer.may_upload


def test_a_connection_beyond_the_cap_takes_the_place_of_the_quietest():
    async def main():
        door = server("tcp://127.0.0.1:5555", connections=2)
        first, second, third = (Connection(door, *peer_of(None, ("127.0.0.1", port))) for port in (1, 2, 3))
        first.answering = True  # being answered: never the one to go
        assert door.admit(first) and door.admit(second) and door.admit(third)
        fourth = Connection(door, *peer_of(None, ("127.0.0.1", 4)))
        third.answering = True
        return door, door.admit(fourth), second

    door, fourth, second = run(main())
    assert door.connections and second not in door.connections and second.closing_at is not None
    assert not fourth and door.dropped == 2  # the second evicted; then every place is being answered
