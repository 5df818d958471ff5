"""The ZMQ door's socket: ZMTP 3 over asyncio's tcp and unix-socket transports (app/frontdoors/zmtp.py reads the
bytes), one `Connection` per peer, on the service's event loop. What libzmq's ROUTER socket gave the door, without
its one flaw here: libzmq hands over a message only once all of it has come, and nothing bounds its frames, so a
peer could make it hold any amount of memory before the door saw a byte (docs/frigate.md, "Why the door speaks ZMTP
itself").

Who may connect is decided at the accept call, before a transport or a byte of the connection is made
(`PeerPolicy`: loopback always, ZMQ_ALLOW_FROM, or anyone with ZMQ_ALLOW_REMOTE; an ipc peer by the socket file's
permissions), ACCEPT_BATCH connections a turn of the event loop at most, so that a flood of them waits in the kernel's
backlog while the loop answers the others. At most ZMQ_MAX_CONNECTIONS are held: a new one beyond takes the place of
the quietest one that has nothing being answered (the longest without a whole message, or since it connected), or
is closed. A connection hands the door one message at a time: while it is answered, its bytes wait in its scratch
and then in the kernel (a REQ peer sends one request at a time anyway). A peer that has not greeted within
ZMQ_PEER_TIMEOUT_S, or whose message under way has not moved for as long, is dropped. Every peer dropped is logged
(app/refusal_log.py, rate-limited) and counted (edgetpu_serve_zmq_dropped_peers_total by reason); one dropped in the
middle of a message is answered first, when the door can tell what it asked (`Handler.refused_message`). The
listening sockets, tcp and ipc, are app/frontdoors/zmq_listen.py's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from typing import Protocol

from app import metrics
from app.frontdoors.zmq_listen import IpcSocket, peer_of, tcp_sockets
from app.frontdoors.zmtp import GREETING, MESSAGE_STAGE, Dropped, FrameReader, ReaderLimits, encode, ready
from app.refusal_log import RefusalLog
from app.settings import ZmqEndpoint, zmq_network

log = logging.getLogger(__name__)

# The sweep of timeouts runs this often (a fraction of ZMQ_PEER_TIMEOUT_S, at most)
SWEEP_S = 1.0
# A connection closed with its answer still unsent is cut this long after (a peer that does not read)
CLOSE_WAIT_S = 2.0
# Replies a peer has not read, buffered, before its connection stops being read (asyncio's high-water mark)
WRITE_BUFFER_BYTES = 64 * 1024
# Connections accepted a turn of the event loop at most
ACCEPT_BATCH = 16
# A large frame that trickles in small reads (zmtp.FrameReader.trickling: 50 peers writing 300 KB tensors in 512-byte
# pieces took 43% of a core in reads) is read again only after COALESCE_S, each read taking what gathered meanwhile;
# a frame sent whole comes in a few large reads and is never paused, and a slow link's still arrives at its pace
COALESCE_S = 0.005
# What the door sends a peer as it connects: its greeting and its READY (NULL has nothing to wait for)
OPENING = GREETING + ready()


class BindError(Exception):
    """The endpoint cannot be served; the message says why and what to do."""


@dataclass(frozen=True)
class PeerPolicy:
    """Who may connect over tcp, and who may send models: loopback (and every ipc peer) always; `allow_from`;
    everyone where `anyone` (ZMQ_ALLOW_REMOTE)."""

    allow_from: tuple = ()
    upload_from: tuple = ()
    anyone: bool = False

    @classmethod
    def from_settings(cls, allow_from, upload_from, anyone: bool) -> PeerPolicy:
        return cls(tuple(zmq_network(a) for a in allow_from), tuple(zmq_network(a) for a in upload_from), anyone)

    def admits(self, address) -> bool:
        return address is None or address.is_loopback or self.anyone or _within(address, self.allow_from)

    def uploads(self, address) -> bool:
        return address is None or address.is_loopback or _within(address, self.upload_from)


def _within(address, networks) -> bool:
    return any(address.version == n.version and address in n for n in networks)


class Handler(Protocol):
    """The door behind the socket (app/frontdoors/zmq_door.py)."""

    def frame_limit(self, peer: Connection, frames: list, size: int) -> int: ...

    def message(self, peer: Connection, frames: list) -> None:
        """A whole message: answer it with peer.send() (no other message of this peer comes before)."""

    def refused_message(self, peer: Connection, frames: list, dropped: Dropped) -> list[bytes] | None:
        """The answer to the message under way when its peer is dropped, or None when there is nobody to answer."""

    def peer_lost(self, peer: Connection) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """One peer: its transport, its reader, the one message being answered."""

    def __init__(self, server: ZmtpServer, address, name: str):
        self.server = server
        self.name = name
        self.address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = address   # None: an ipc peer
        self.may_upload = server.policy.uploads(address)
        self.connected_at = self.active_at = self.moved_at = time.monotonic()  # active: its last whole message
        self.answering = False     # a message handed to the door, not yet answered
        self.refused_in_a_row = 0  # the door's: its requests refused since its last one answered
        self.closing_at: float | None = None
        self.transport: asyncio.Transport | None = None
        self.reader: FrameReader | None = None
        self._write_paused = self._reading_paused = self._feeding = False

    # -- asyncio ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        if self.closing_at is not None:  # evicted while its transport was being made
            transport.abort()
            return
        transport.set_write_buffer_limits(WRITE_BUFFER_BYTES)
        self.reader = FrameReader(self, self.server.limits)
        transport.write(OPENING)

    def get_buffer(self, sizehint: int) -> memoryview:
        reader = self.reader
        return reader.buffer() if reader is not None else memoryview(bytearray(1))  # closing: nothing is read

    def buffer_updated(self, nbytes: int) -> None:
        if self.reader is None:  # closing: what came is dropped
            return
        self.moved_at = time.monotonic()
        self._feed(self.reader.received, nbytes)
        reader = self.reader
        if reader is None or self._reading_paused:
            return
        if reader.paused and reader.full():
            self._reading_paused = True
            self.transport.pause_reading()
        elif reader.trickling():
            # a large frame coming in small pieces: let them gather in the kernel (reads, not bytes, cost here)
            self._reading_paused = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(COALESCE_S, self._read_again)

    def eof_received(self) -> bool:
        return False  # a half-closed peer is closed: it can read no answer after its last message anyway

    def connection_lost(self, exc: Exception | None) -> None:
        self.reader = None  # a frame half received is freed with it
        self.server.lost(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.reader is not None:
            self.reader.paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resume()

    # -- the reader's owner (zmtp.Owner) ----------------------------------------------------------------

    def frame_limit(self, frames: list, size: int) -> int:
        return self.server.handler.frame_limit(self, frames, size)

    def message(self, frames: list) -> None:
        self.active_at = self.moved_at
        self.answering = True
        self.reader.paused = True
        self.server.handler.message(self, frames)

    def command(self, reply: bytes) -> None:
        self.transport.write(reply)

    # -- the door's --------------------------------------------------------------------------------------------

    def send(self, frames: list[bytes], pace_s: float = 0.0) -> None:
        """The answer to the message being answered; the next message is read then (after `pace_s`)."""
        if self.reader is None or self.closing_at is not None:
            return
        self.transport.write(encode(frames))
        self.answering = False
        if pace_s > 0:
            asyncio.get_running_loop().call_later(pace_s, self._resume)
        elif self._feeding:  # answered while the reader hands over: it goes on once it has returned
            asyncio.get_running_loop().call_soon(self._resume)
        else:
            self._resume()

    def close(self) -> None:
        if self.closing_at is None:
            self.closing_at = time.monotonic()
            self.reader = None
            if self.transport is not None:
                self.transport.close()

    def _resume(self) -> None:
        if self.reader is None or self.answering or self._write_paused:
            return
        self._feed(self.reader.resume)
        if self._reading_paused and self.reader is not None and not self.reader.full():
            self._reading_paused = False
            self.transport.resume_reading()

    def _read_again(self) -> None:
        if self._reading_paused and self.reader is not None and not self.reader.paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _feed(self, step, *args) -> None:
        self._feeding = True
        try:
            step(*args)
        except Dropped as dropped:
            self.server.drop(self, dropped)
        finally:
            self._feeding = False


class ZmtpServer:
    """The endpoint's listening socket and its connections."""

    def __init__(self, endpoint: ZmqEndpoint, handler: Handler, policy: PeerPolicy, *, max_connections: int,
                 timeout_s: float, limits: ReaderLimits, refusals: RefusalLog):
        self.endpoint = endpoint
        self.handler = handler
        self.policy = policy
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.limits = limits
        self.refusals = refusals
        self.connections: set[Connection] = set()
        self.dropped = 0
        self._sockets: list[socket.socket] = []
        self._sweeper: asyncio.Task | None = None
        self._ipc: IpcSocket | None = None

    async def start(self) -> None:
        """Listen; BindError saying why not."""
        loop = asyncio.get_running_loop()
        try:
            if self.endpoint.scheme == "tcp":
                self._sockets = await tcp_sockets(self.endpoint)
            else:
                self._ipc = IpcSocket(self.endpoint.path)
                self._sockets = [self._ipc.listen()]
        except OSError as e:
            raise BindError(f"cannot bind {self.endpoint.text}: {e.strerror or e}") from None
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        self._sweeper = loop.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []
        for connection in list(self.connections):
            connection.close()
        if self._ipc is not None:
            self._ipc.remove()

    def _accept(self, listening: socket.socket) -> None:
        """The connections waiting, ACCEPT_BATCH at most a turn of the loop (a flood of them waits in the kernel's
        backlog meanwhile, and the loop's other work goes on): each admitted, or closed before a transport or a byte
        of it is made."""
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, say: accepting waits a moment
                log.warning("ZMQ door: accept failed on %s: %s", self.endpoint.text, e)
                loop.remove_reader(listening.fileno())
                loop.call_later(1.0, loop.add_reader, listening.fileno(), self._accept, listening)
                return
            address, name = peer_of(sock, peer)
            connection = Connection(self, address, name)
            if not self.admit(connection):
                sock.close()
                continue
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an answer is one small write
            task = loop.create_task(loop.connect_accepted_socket(lambda c=connection: c, sock))
            task.add_done_callback(lambda t, c=connection, s=sock: self._made(t, c, s))

    def _made(self, task: asyncio.Task, connection: Connection, sock: socket.socket) -> None:
        if task.cancelled() or task.exception() is not None:  # the peer gone before its transport was made
            sock.close()
            self.lost(connection)

    def admit(self, connection: Connection) -> bool:
        """Whether a new connection is kept: its address allowed, and a place for it."""
        if not self.policy.admits(connection.address):
            self._count(connection, Dropped("not_allowed", f"{connection.address} is not in ZMQ_ALLOW_FROM"))
            return False
        if len(self.connections) >= self.max_connections:
            quiet = [c for c in self.connections if not c.answering]
            if not quiet:
                self._count(connection, Dropped("connections", f"{self.max_connections} connections are held "
                                                               "(ZMQ_MAX_CONNECTIONS), each being answered"))
                return False
            # the quietest: the one longest without a whole message (a slow greeting's since it connected)
            oldest = min(quiet, key=lambda c: c.active_at)
            self.drop(oldest, Dropped("evicted", f"its place taken by a new connection ({self.max_connections} "
                                                 "held, ZMQ_MAX_CONNECTIONS); it was the quietest"))
            self.lost(oldest)  # its place is free now, whenever its transport goes
        self.connections.add(connection)
        return True

    def drop(self, connection: Connection, why: Dropped) -> None:
        """Close a peer's connection, answering the message under way where the door can."""
        if connection.closing_at is not None:
            return
        self._count(connection, why)
        answer = None
        if why.frames is not None and not connection.answering:
            try:
                answer = self.handler.refused_message(connection, why.frames, why)
            except Exception:  # a bug: the drop goes on
                log.exception("ZMQ door: answering %s before dropping it", connection.name)
        if answer is not None and connection.transport is not None:
            connection.transport.write(encode(answer))
        connection.close()

    def _count(self, connection: Connection, why: Dropped) -> None:
        self.dropped += 1
        metrics.zmq_dropped(why.reason)
        self.refusals.refused("ZMQ", f"{self.endpoint.text}: dropped {connection.name} ({why.reason})", why)

    def lost(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.handler.peer_lost(connection)

    async def _sweep(self) -> None:
        """Drop the peers that have not greeted in time and those whose message stalled; cut closings that hang."""
        while True:
            await asyncio.sleep(min(SWEEP_S, self.timeout_s / 4))
            now = time.monotonic()
            for connection in list(self.connections):
                reader = connection.reader
                if connection.closing_at is not None:
                    if now - connection.closing_at > CLOSE_WAIT_S and connection.transport is not None:
                        connection.transport.abort()
                elif (reader is not None and reader.stage < MESSAGE_STAGE
                      and now - connection.connected_at > self.timeout_s):
                    self.drop(connection, Dropped("greeting_timeout", f"no greeting and READY within "
                                                                      f"{self.timeout_s:g} s (ZMQ_PEER_TIMEOUT_S)"))
                elif reader is not None and reader.under_way() and now - connection.moved_at > self.timeout_s:
                    self.drop(connection, Dropped("stalled", f"its message has not moved for {self.timeout_s:g} s "
                                                             "(ZMQ_PEER_TIMEOUT_S)", reader.frames))
