"""A raw ZMTP 3 peer on a plain socket, written from the specification (rfc.zeromq.org/spec/23, /spec/37), not from the
service's reader: the peer a test or a benchmark needs to do what libzmq never does (stall in the middle of a frame,
send a message of a million frames, declare a frame of 2**62 bytes, greet slowly, send garbage), and to check that
what comes back is ZMTP. Blocking, one socket; the attacks in bench/hostile.py run many of these on threads or as
asyncio streams (`greeting`, `ready_command`, `frame_head` give the bytes).

    peer = RawPeer.tcp("127.0.0.1", 5555).handshake()        # greeting and READY, as libzmq's REQ sends them
    peer.send_request([header, tensor])                      # the REQ envelope (an empty frame) first
    frames = peer.read_message()                             # the reply, its envelope removed
"""

from __future__ import annotations

import socket

MORE, LONG, COMMAND = 1, 2, 4


def greeting(mechanism: bytes = b"NULL", major: int = 3, minor: int = 1) -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + bytes([major, minor]) + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)


def frame_head(size: int, more: bool = False, command: bool = False, long: bool | None = None) -> bytes:
    flags = (MORE if more else 0) | (COMMAND if command else 0)
    if long or (long is None and size > 255):
        return bytes([flags | LONG]) + size.to_bytes(8, "big")
    return bytes([flags, size])


def command(name: bytes, body: bytes = b"") -> bytes:
    data = bytes([len(name)]) + name + body
    return frame_head(len(data), command=True) + data


def ready_command(socket_type: bytes = b"REQ", identity: bytes = b"") -> bytes:
    properties = b"".join(bytes([len(k)]) + k + len(v).to_bytes(4, "big") + v
                          for k, v in ((b"Socket-Type", socket_type), (b"Identity", identity)))
    return command(b"READY", properties)


def message(frames: list[bytes]) -> bytes:
    return b"".join(frame_head(len(f), more=i < len(frames) - 1) + f for i, f in enumerate(frames))


class RawPeer:
    def __init__(self, sock: socket.socket, timeout_s: float = 30.0):
        self.sock = sock
        self.sock.settimeout(timeout_s)
        self.server_ready: bytes | None = None

    @classmethod
    def tcp(cls, host: str, port: int, timeout_s: float = 30.0) -> RawPeer:
        return cls(socket.create_connection((host, port), timeout=timeout_s), timeout_s)

    @classmethod
    def ipc(cls, path: str, timeout_s: float = 30.0) -> RawPeer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(path)
        return cls(sock, timeout_s)

    def handshake(self, socket_type: bytes = b"REQ") -> RawPeer:
        self.sock.sendall(greeting() + ready_command(socket_type))
        theirs = self.read_exactly(64)
        assert theirs[0] == 0xFF and theirs[9] & 1 and theirs[10] == 3, theirs
        assert theirs[12:32].rstrip(b"\0") == b"NULL", theirs
        flags, body = self.read_frame()
        assert flags & COMMAND and body[1:1 + body[0]] == b"READY", (flags, body[:40])
        self.server_ready = body
        return self

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_request(self, frames: list[bytes]) -> None:
        self.sock.sendall(message([b"", *frames]))

    def read_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def read_frame(self) -> tuple[int, bytes]:
        flags = self.read_exactly(1)[0]
        size = int.from_bytes(self.read_exactly(8), "big") if flags & LONG else self.read_exactly(1)[0]
        return flags, self.read_exactly(size)

    def read_message(self) -> list[bytes]:
        """The next message's frames after the REQ envelope (its empty frame), commands skipped."""
        frames = []
        while True:
            flags, body = self.read_frame()
            if flags & COMMAND:
                continue
            frames.append(body)
            if not flags & MORE:
                break
        assert frames and frames[0] == b"", frames[:2]
        return frames[1:]

    def closed(self) -> bool:
        """Whether the other side has closed (reads until the end, dropping what comes): True, or a timeout."""
        try:
            while self.sock.recv(65536):
                pass
            return True
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()
