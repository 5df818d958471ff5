"""The ZMQ door's listening sockets (app/frontdoors/zmq_server.py accepts on them): tcp, and ipc's socket file.

tcp: every address the endpoint's host names (`*`: every IPv4 one). ipc: a socket file that another live process
serves is refused (probed by connecting to it first), a stale one (nobody answers) replaced, a file that is no socket
left alone; an abstract socket (ipc://@name) has no file; the directories made for the socket are removed again when
the bind fails, and the socket file when the door stops, if it is still ours.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
import stat
import struct
from pathlib import Path

from app.settings import ZmqEndpoint

BACKLOG = 128
PROBE_TIMEOUT_S = 1.0


async def tcp_sockets(endpoint: ZmqEndpoint) -> list[socket.socket]:
    """Listening, non-blocking sockets on every address of the endpoint's host; OSError when one will not bind."""
    host = None if endpoint.host == "*" else endpoint.host
    family = socket.AF_INET if host is None else socket.AF_UNSPEC
    infos = await asyncio.get_running_loop().getaddrinfo(host, endpoint.port, family=family,
                                                         type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for address_family, kind, protocol, _, address in dict.fromkeys(
                (f, k, p, "", a) for f, k, p, _, a in infos):
            sock = socket.socket(address_family, kind, protocol)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if address_family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def peer_of(sock: socket.socket, peer) -> tuple:
    """An accepted connection's address (None over ipc) and its name for the log: ADDRESS:PORT, or the ipc peer's
    process."""
    if isinstance(peer, tuple) and peer:
        address = ipaddress.ip_address(peer[0].split("%", 1)[0])
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address, f"{address}:{peer[1]}" if address.version == 4 else f"[{address}]:{peer[1]}"
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return None, f"ipc pid {pid} uid {uid}"
    except (AttributeError, OSError, struct.error):
        return None, "ipc peer"


class IpcSocket:
    """An ipc endpoint's file: refused when a live process holds it, replaced when stale; the directories made for
    it removed when the bind fails, and the file when the door stops while it is still ours."""

    def __init__(self, path: str):
        self.abstract = path.startswith("@")
        self.path = "\0" + path[1:] if self.abstract else path
        self._made: list[Path] = []
        self._inode: int | None = None

    def listen(self) -> socket.socket:
        """The listening, non-blocking socket; OSError saying why not."""
        if not self.abstract:
            self._prepare()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            self._unmake()
            raise
        if not self.abstract:
            self._inode = os.stat(self.path).st_ino
        return sock

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
