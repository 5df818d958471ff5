"""Design (b) of issue 42, for measurement only: the ZMQ door's socket on libzmq instead of the door's own ZMTP reader
(app/frontdoors/zmq_server.py). Not part of the product (docs/frigate.md, "Why the door speaks ZMTP itself", says
why).

A ROUTER socket with everything libzmq offers against a hostile peer:
  - ZMQ_MAXMSGSIZE at the largest frame the door takes (the largest served input, or ZMQ_MAX_MODEL_BYTES with
    uploads on): libzmq drops a peer that declares a larger frame before buffering it;
  - a ZAP handler (inproc://zeromq.zap.01) that admits a connection by its address (the door's PeerPolicy) and
    while fewer than ZMQ_MAX_CONNECTIONS are open, counted from the socket monitor's accepted and disconnected events;
  - ZMQ_RCVHWM 16 messages per peer;
  - the socket drained off the event loop, on a thread of its own that owns it (receives, sends the replies the loop
    hands it through a queue and an inproc wake-up), each message handed to the door on the loop.
What it cannot do: count frames as they come. A ROUTER hands over a message only once all of it has come, and nothing
bounds its frames, so a message of many small frames is held whole (about 60 bytes of libzmq per frame) before the
door sees any of it; its bound is connections x the bytes a peer sends. bench/hostile.py --only zmq measures both.

    python bench/zmq_libzmq_server.py        # python -m app, with this as the door's socket (settings as usual)
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.frontdoors.frigate import MAX_HEADER_BYTES  # noqa: E402
from app.frontdoors.zmq_server import BindError  # noqa: E402

RECEIVE_QUEUE = 16
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
WAKE_ENDPOINT = "inproc://edgetpu-serve-wake"


class Peer:
    """A ROUTER peer, by its routing id: what the door asks of a connection."""

    def __init__(self, server: LibzmqServer, identity: bytes, address: str):
        self.server, self.identity = server, identity
        self.name = f"{address or 'ipc'} ({identity.hex()})"
        self.address = address
        self.may_upload = True
        self.active_at = time.monotonic()
        self.refused_in_a_row = 0

    def send(self, frames: list[bytes], pace_s: float = 0.0) -> None:
        """On the event loop. A paced answer is sent later: libzmq reads the peer's next message meanwhile anyway,
        but a REQ peer sends none before its answer."""
        if pace_s > 0:
            self.server.loop.call_later(pace_s, self.send, frames)
            return
        self.server.outbox.put([self.identity, *frames])
        self.server.wake.send(b"", zmq.NOBLOCK)


class LibzmqServer:
    """The door's socket (ZmtpServer's interface) on a libzmq ROUTER drained on a thread."""

    def __init__(self, endpoint, handler, policy, *, max_connections: int, timeout_s: float, limits, refusals):
        self.endpoint, self.handler, self.policy = endpoint, handler, policy
        self.max_connections, self.limits = max_connections, limits
        self.connections: dict[bytes, Peer] = {}
        self.dropped = 0
        self.open = 0
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._running = True

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        uploads = getattr(self.handler.uploads, "accepting", False)
        largest = max(self.handler._largest_input(), MAX_HEADER_BYTES)
        self.max_frame = self.handler.uploads.max_bytes if uploads else largest
        self.context = zmq.Context()
        self.zap = self.context.socket(zmq.REP)
        self.zap.bind(ZAP_ENDPOINT)
        self.router = self.context.socket(zmq.ROUTER)
        for option, value in ((zmq.MAXMSGSIZE, self.max_frame), (zmq.RCVHWM, RECEIVE_QUEUE), (zmq.LINGER, 0)):
            self.router.setsockopt(option, value)
        self.router.setsockopt(zmq.ZAP_DOMAIN, b"edgetpu-serve")  # asks ZAP about NULL peers too
        self.monitor = self.router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        try:
            self.router.bind(self.endpoint.text)
        except zmq.ZMQError as e:
            raise BindError(f"cannot bind {self.endpoint.text}: {e}") from None
        wake_in = self.context.socket(zmq.PAIR)
        wake_in.bind(WAKE_ENDPOINT)
        self.wake = self.context.socket(zmq.PAIR)
        self.wake.connect(WAKE_ENDPOINT)
        self.thread = threading.Thread(target=self._drain, args=(wake_in,), name="zmq-drain", daemon=True)
        self.thread.start()

    async def stop(self) -> None:
        self._running = False
        await asyncio.to_thread(self.thread.join, 5)
        self.wake.close(linger=0)
        self.context.term()

    def _drain(self, wake_in) -> None:
        poller = zmq.Poller()
        for sock in (self.router, self.zap, self.monitor, wake_in):
            poller.register(sock, zmq.POLLIN)
        while self._running:
            for sock, _ in poller.poll(100):
                if sock is self.router:
                    self._receive()
                elif sock is self.zap:
                    self._authenticate()
                elif sock is self.monitor:
                    self._event()
                else:
                    wake_in.recv()
                    while True:
                        try:
                            frames = self.outbox.get_nowait()
                        except queue.Empty:
                            break
                        try:
                            self.router.send_multipart(frames, zmq.NOBLOCK)
                        except zmq.ZMQError:  # a peer gone, or not reading: its answer dropped, as a ROUTER does
                            pass
        for sock in (self.router, self.zap, self.monitor, wake_in):
            sock.close(linger=0)

    def _receive(self) -> None:
        for _ in range(32):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            peer = self.connections.get(identity)
            if peer is None:
                try:
                    address = frames[0].get("Peer-Address")
                except zmq.ZMQError:
                    address = ""
                peer = self.connections[identity] = Peer(self, identity, address)
            peer.active_at = time.monotonic()
            self.loop.call_soon_threadsafe(self.handler.message, peer, [f.bytes for f in frames[1:]])

    def _authenticate(self) -> None:
        import ipaddress

        version, request_id, domain, address, identity, mechanism, *_ = self.zap.recv_multipart()
        try:
            allowed = self.policy.admits(ipaddress.ip_address(address.decode())) if address else True
        except ValueError:
            allowed = False
        ok = allowed and self.open <= self.max_connections
        if not ok:
            self.dropped += 1
        self.zap.send_multipart([version, request_id, b"200" if ok else b"400",
                                 b"OK" if ok else b"not allowed", b"", b""])

    def _event(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        event = recv_monitor_message(self.monitor)["event"]
        self.open += 1 if event == zmq.EVENT_ACCEPTED else -1


def main() -> int:
    import app.frontdoors.zmq_door as door
    from app.__main__ import main as serve

    door.ZmtpServer = LibzmqServer
    return serve()


if __name__ == "__main__":
    sys.exit(main())
