"""The ZMQ door's socket: ZMTP 3 over asyncio's tcp and unix-socket transports (app/frontdoors/zmtp.py reads the
bytes), one `Connection` per peer, on the service's event loop. What libzmq's ROUTER socket gave the door, without
its one flaw here: libzmq hands over a message only once all of it has come, and nothing bounds its frames, so a
peer could make it hold any amount of memory before the door saw a byte (docs/frigate.md, "Why not libzmq").

Who may connect is decided when the connection is accepted (`PeerPolicy`: loopback always, ZMQ_ALLOW_FROM, or
anyone with ZMQ_ALLOW_REMOTE; an ipc peer by the socket file's permissions), before a byte is read. At most
ZMQ_MAX_CONNECTIONS are held: a new one beyond takes the place of the quietest one that has nothing being answered
(one that never finished its greeting first), or is closed. A connection hands the door one message at a time:
while it is answered, its bytes wait in its scratch and then in the kernel (a REQ peer sends one request at a time
anyway). A peer that has not greeted within ZMQ_PEER_TIMEOUT_S, or whose message under way has not moved for as
long, is dropped. Every peer dropped is logged (app/refusal_log.py, rate-limited) and counted
(edgetpu_serve_zmq_dropped_peers_total by reason); one dropped in the middle of a message is answered first, when
the door can tell what it asked (`Handler.refused_message`).

ipc: an endpoint whose socket another live process holds is refused (probed by connecting to it first), a stale
one (nobody answers) replaced; an abstract socket only where settings allow it; directories made for the socket
are removed again when the bind fails, and the socket file when the door stops (if it is still ours).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import os
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app import metrics
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
PROBE_TIMEOUT_S = 1.0
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

    def __init__(self, server: ZmtpServer):
        self.server = server
        self.name = "?"
        self.address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None   # None: an ipc peer
        self.may_upload = False
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
        self.address, self.name = peer_of(transport)
        transport.set_write_buffer_limits(WRITE_BUFFER_BYTES)
        if not self.server.accept(self):
            return
        self.may_upload = self.server.policy.uploads(self.address)
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
        if reader is not None and reader.paused and reader.full() and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

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
        if self.transport is not None and self.closing_at is None:
            self.closing_at = time.monotonic()
            self.reader = None
            self.transport.close()

    def _resume(self) -> None:
        if self.reader is None or self.answering or self._write_paused:
            return
        self._feed(self.reader.resume)
        if self._reading_paused and self.reader is not None and not self.reader.full():
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


def peer_of(transport: asyncio.BaseTransport) -> tuple:
    """A peer's address (None over ipc) and its name for the log: ADDRESS:PORT, or the ipc peer's process."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        address = ipaddress.ip_address(peer[0].split("%", 1)[0])
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address, f"{address}:{peer[1]}" if address.version == 4 else f"[{address}]:{peer[1]}"
    sock = transport.get_extra_info("socket")
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return None, f"ipc pid {pid} uid {uid}"
    except (AttributeError, OSError, struct.error):
        return None, "ipc peer"


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
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._ipc: IpcSocket | None = None

    async def start(self) -> None:
        """Listen; BindError saying why not."""
        loop = asyncio.get_running_loop()
        try:
            if self.endpoint.scheme == "tcp":
                host = None if self.endpoint.host == "*" else self.endpoint.host
                self._server = await loop.create_server(self._connection, host, self.endpoint.port,
                                                        family=socket.AF_INET if host is None else socket.AF_UNSPEC)
            else:
                self._ipc = IpcSocket(self.endpoint.path)
                self._server = await self._ipc.listen(lambda path: loop.create_unix_server(self._connection, path))
        except OSError as e:
            raise BindError(f"cannot bind {self.endpoint.text}: {e.strerror or e}") from None
        self._sweeper = loop.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        if self._ipc is not None:
            self._ipc.remove()

    def _connection(self) -> Connection:
        return Connection(self)

    def accept(self, connection: Connection) -> bool:
        """Whether a new connection is kept: its address allowed, and a place for it."""
        if not self.policy.admits(connection.address):
            self._refuse(connection, Dropped("not_allowed", f"{connection.address} is not in ZMQ_ALLOW_FROM"))
            return False
        if len(self.connections) >= self.max_connections:
            quiet = [c for c in self.connections if not c.answering]
            if not quiet:
                self._refuse(connection, Dropped("connections", f"{self.max_connections} connections are held "
                                                                "(ZMQ_MAX_CONNECTIONS), each being answered"))
                return False
            # the quietest: one that never greeted before one that did; then the one longest without a message
            oldest = min(quiet, key=lambda c: (c.reader is not None and c.reader.stage == MESSAGE_STAGE, c.active_at))
            self.drop(oldest, Dropped("evicted", f"its place taken by a new connection ({self.max_connections} "
                                                 "held, ZMQ_MAX_CONNECTIONS); it was the quietest"))
        self.connections.add(connection)
        return True

    def _refuse(self, connection: Connection, why: Dropped) -> None:
        self._count(connection, why)
        connection.transport.abort()

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
        if answer is not None:
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
                    if now - connection.closing_at > CLOSE_WAIT_S:
                        connection.transport.abort()
                elif reader is not None and reader.stage < MESSAGE_STAGE and now - connection.connected_at > self.timeout_s:
                    self.drop(connection, Dropped("greeting_timeout", f"no greeting and READY within "
                                                                      f"{self.timeout_s:g} s (ZMQ_PEER_TIMEOUT_S)"))
                elif reader is not None and reader.under_way() and now - connection.moved_at > self.timeout_s:
                    self.drop(connection, Dropped("stalled", f"its message has not moved for {self.timeout_s:g} s "
                                                             "(ZMQ_PEER_TIMEOUT_S)", reader.frames))


class IpcSocket:
    """An ipc endpoint's file: refused when a live process holds it, replaced when stale; the directories made for
    it removed when the bind fails, and the file when the door stops while it is still ours."""

    def __init__(self, path: str):
        self.abstract = path.startswith("@")
        self.path = "\0" + path[1:] if self.abstract else path
        self._made: list[Path] = []
        self._inode: int | None = None

    async def listen(self, create):
        if not self.abstract:
            self._prepare()
        try:
            server = await create(self.path)
        except OSError:
            self._unmake()
            raise
        if not self.abstract:
            self._inode = os.stat(self.path).st_ino
        return server

    def _prepare(self) -> None:
        path = Path(self.path)
        missing = [p for p in reversed(path.parents) if not p.exists()]
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(errno.EEXIST, f"{path} exists and is not a socket: not replaced")
            if self._answers(path):
                raise OSError(errno.EADDRINUSE, f"another live process serves {path} (it answered a connection): "
                                                "stop it, or bind another path")
            path.unlink()  # stale: its process is gone
        for directory in missing:
            directory.mkdir()
            self._made.append(directory)

    @staticmethod
    def _answers(path: Path) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(PROBE_TIMEOUT_S)
        try:
            probe.connect(str(path))
            return True
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError as e:  # no permission to connect, say: someone's, and not ours to replace
            raise OSError(e.errno, f"{path} cannot be probed ({e.strerror}): not replaced") from None
        finally:
            probe.close()

    def _unmake(self) -> None:
        for directory in reversed(self._made):
            try:
                directory.rmdir()
            except OSError:
                break
        self._made.clear()

    def remove(self) -> None:
        if self._inode is None:
            return
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        self._unmake()
