"""ZMTP 3, ZeroMQ's wire protocol, as far as Frigate's client speaks it (rfc.zeromq.org/spec/23 and /spec/37; the NULL
mechanism, /spec/37's READY): bytes in, frames out, every limit applied as the bytes arrive. No socket here: the
connection that feeds it is app/frontdoors/zmq_server.py's.

A peer's bytes, in order:

    greeting  0xFF, 8 bytes, 0x7F | version 3.x | mechanism "NULL" padded to 20 | as-server | 31 filler (64 bytes)
    READY     a command frame: flags 0x04, size, 5 "READY", properties (1-byte name length, name, 4-byte value
              length, value): Socket-Type REQ or DEALER (Frigate's is libzmq's REQ), Identity
    messages  frames: flags (1 MORE, 2 LONG: an 8-byte size, 4 COMMAND), size (1 or 8 bytes, big-endian), body;
              a message is its frames up to the first without MORE. A REQ peer starts each with an empty frame.

`FrameReader` is the state machine, fed the way asyncio's BufferedProtocol feeds a protocol: `buffer()` says where
the next bytes go, `received(n)` says how many came. Frame heads, commands and small frames land in the reader's
scratch (SCRATCH_BYTES); a frame that does not fit there is received straight into its own buffer, allocated once
its declared size has passed its owner's limit (`frame_limit`, asked as each frame's head arrives), so that the
kernel copies it once and nothing else does (only the part that came in the same read as its head is copied over).
At the first thing that breaks the protocol or a limit (a greeting that is not ZMTP 3 or not NULL, a command too
large, a reserved flag, more than `max_frames` frames in a message, a frame past its limit) the reader raises
`Dropped`, with the message under way, before anything of it is held: nothing is read past the offending head.
The one exception is a frame its owner wants to know without holding (HASH: an upload compared with a file it may
equal): its bytes are read into one process-wide buffer, hashed and dropped. Each call does bounded work: at most
`max_frames` frame heads and one message handed over before the owner may pause it (`paused`), what came after
waiting in the scratch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MORE, LONG, COMMAND = 1, 2, 4
RESERVED_FLAGS = 0xF8
SIGNATURE_BYTES, GREETING_BYTES = 10, 64
# Our greeting: ZMTP 3.1, NULL, not as-server (NULL has no roles). Sent whole at once: libzmq reads it as it comes.
GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)
# Socket types a ROUTER talks to (libzmq's check_socket_type for ROUTER)
PEER_TYPES = frozenset({"REQ", "DEALER", "ROUTER"})
SCRATCH_BYTES = 16 * 1024
COMMAND_MAX_BYTES = 4096   # a READY with its properties; PING; a larger command is no client's
# A large frame read in more than TRICKLE_READS pieces of under TRICKLE_BYTES is trickling (FrameReader.trickling)
TRICKLE_READS, TRICKLE_BYTES = 32, 16 * 1024
# Bytes of frames read through a hash land here, one buffer for the process: every reader consumes them at once
_HASHED = memoryview(bytearray(256 * 1024))
# frame_limit's answer for a frame to read through a hash, not held (its owner may also raise Dropped itself)
HASH = -2


class Dropped(Exception):
    """The peer is dropped: `reason` a short label (metrics, log), `message` why. `frames`: the message under way when
    it came (its envelope and header, for an answer before the connection closes), None before the handshake."""

    def __init__(self, reason: str, message: str, frames: list | None = None):
        super().__init__(message)
        self.reason, self.message, self.frames = reason, message, frames


class Skipped:
    """A frame read through a hash (HASH), never held: its size and its sha256."""

    __slots__ = ("size", "sha256")

    def __init__(self, size: int, sha256: str):
        self.size, self.sha256 = size, sha256

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Skipped({self.size})"


class Owner(Protocol):
    """What a reader hands its frames to (the connection, and through it the door)."""

    def frame_limit(self, frames: list, size: int) -> int:
        """The frame of `size` bytes that follows `frames` (the message so far): held when `size` is at most the
        number returned; HASH: read through a hash, not held; past the limit, or Dropped raised here, the peer is
        dropped."""

    def message(self, frames: list) -> None:
        """A whole message: bytes, np.uint8 arrays (frames received in their own buffer) and Skipped."""

    def command(self, reply: bytes) -> None:
        """A command to send back (PONG)."""


@dataclass(frozen=True)
class ReaderLimits:
    max_frames: int = 16           # frames in one message (a REQ peer's: the empty one, the header, the tensor)


GREETING_STAGE, HANDSHAKE_STAGE, MESSAGE_STAGE = range(3)
_SCRATCH, _DIRECT, _HASHING = range(3)


class FrameReader:
    def __init__(self, owner: Owner, limits: ReaderLimits = ReaderLimits()):
        self.owner = owner
        self.limits = limits
        self.stage = GREETING_STAGE
        self.peer_type: str | None = None
        self.paused = False       # set by the owner: no message is handed over until resume()
        self.frames: list = []    # the message under way
        self._scratch = bytearray(SCRATCH_BYTES)
        self._view = memoryview(self._scratch)
        self._start = self._end = 0
        self._mode = _SCRATCH
        self._frame: np.ndarray | None = None   # _DIRECT: the frame being received, and its view
        self._frame_view: memoryview | None = None
        self._got = 0
        self._left = 0                          # _HASHING: bytes of the frame still to come
        self._hash = None
        self._size = 0
        self._more = False
        self._small_reads = 0                   # of the frame under way, past the scratch

    # -- what asyncio's BufferedProtocol asks -------------------------------------------------------------

    def buffer(self) -> memoryview:
        """Where the next bytes go: the frame's own buffer, the process' drop buffer, or the scratch."""
        if self._mode == _DIRECT:
            return self._frame_view[self._got:]
        if self._mode == _HASHING:
            return _HASHED[:min(self._left, len(_HASHED))]
        if self._start:
            pending = self._end - self._start
            self._scratch[:pending] = self._view[self._start:self._end]
            self._start, self._end = 0, pending
        return self._view[self._end:]

    def full(self) -> bool:
        """The scratch holds nothing more: the owner stops reading until it resumes (only while paused)."""
        return self._mode == _SCRATCH and self._end - self._start == SCRATCH_BYTES

    def trickling(self) -> bool:
        """A frame too large for the scratch has come in more than TRICKLE_READS reads of under TRICKLE_BYTES each:
        its peer writes it in small pieces (a frame sent whole comes in a few reads of 64 KiB and more)."""
        return self._small_reads > TRICKLE_READS

    def under_way(self) -> bool:
        """A message (or a frame's head) has begun and not ended."""
        return bool(self.frames) or self._mode != _SCRATCH or (self._end > self._start and not self.paused)

    def received(self, n: int) -> None:
        if self._mode != _SCRATCH and n < TRICKLE_BYTES:
            self._small_reads += 1
        if self._mode == _DIRECT:
            self._got += n
            if self._got == self._size:
                frame, self._frame, self._frame_view, self._mode = self._frame, None, None, _SCRATCH
                self._frame_done(frame)
        elif self._mode == _HASHING:
            self._hash.update(_HASHED[:n])
            self._left -= n
            if not self._left:
                self._mode = _SCRATCH
                self._frame_done(self._skipped())
        else:
            self._end += n
        if self._mode == _SCRATCH and not self.paused:
            self._parse()

    def resume(self) -> None:
        """Hand over what waits in the scratch (the owner has answered the message it was paused on)."""
        self.paused = False
        if self._mode == _SCRATCH:
            self._parse()

    # -- parsing ----------------------------------------------------------------------------------------------

    def _parse(self) -> None:
        if self._start == self._end:
            return
        if self.stage == GREETING_STAGE and not self._greeting():
            return
        if self.stage == HANDSHAKE_STAGE and not self._handshake():
            return
        buf, pos, end = self._view, self._start, self._end
        try:
            while pos < end and not self.paused:
                flags = buf[pos]
                if flags & RESERVED_FLAGS:
                    raise Dropped("framing", f"frame flags {flags:#04x} have reserved bits set: not ZMTP 3",
                                  self.frames)
                if flags & LONG:
                    if end - pos < 9:
                        break
                    size = int.from_bytes(buf[pos + 1:pos + 9], "big")
                    head = 9
                else:
                    if end - pos < 2:
                        break
                    size, head = buf[pos + 1], 2
                if flags & COMMAND:
                    if self.frames or flags & MORE:
                        raise Dropped("framing", "a command inside a message", self.frames)
                    if size > COMMAND_MAX_BYTES:
                        raise Dropped("command", f"a command of {size} bytes (at most {COMMAND_MAX_BYTES})")
                    if end - pos - head < size:
                        break
                    self._command(bytes(buf[pos + head:pos + head + size]))
                    pos += head + size
                    continue
                pos += head
                self._more = bool(flags & MORE)
                pos = self._body(size, pos, end)
                if self._mode != _SCRATCH:
                    break
        finally:
            self._start = pos

    def _body(self, size: int, pos: int, end: int) -> int:
        """A frame of `size` bytes whose head ends at `pos`: taken whole from the scratch, or begun there and
        continued in its own buffer (or the drop buffer). Returns where the scratch's unread bytes now start."""
        frames = self.frames
        if len(frames) >= self.limits.max_frames:
            raise Dropped("frames", f"a message of more than {self.limits.max_frames} frames", frames)
        try:
            limit = self.owner.frame_limit(frames, size)
        except Dropped as dropped:
            dropped.frames = frames
            raise
        here = min(size, end - pos)
        if size <= limit:
            if here == size:
                self._frame_done(bytes(self._view[pos:pos + size]))
                return pos + size
            self._frame = np.empty(size, np.uint8)  # pages come as the bytes are written
            self._frame_view = memoryview(self._frame)
            self._frame_view[:here] = self._view[pos:end]
            self._got, self._size, self._mode = here, size, _DIRECT
            return end
        if limit != HASH:
            raise Dropped("frame_size", f"a frame of {size} bytes where at most {max(limit, 0)} may come", frames)
        self._size = size
        self._hash = hashlib.sha256(self._view[pos:pos + here])
        if here == size:
            self._frame_done(self._skipped())
        else:
            self._left, self._mode = size - here, _HASHING
        return pos + here

    def _skipped(self) -> Skipped:
        digest, self._hash = self._hash.hexdigest(), None
        return Skipped(self._size, digest)

    def _frame_done(self, frame) -> None:
        self._small_reads = 0
        self.frames.append(frame)
        if not self._more:
            frames, self.frames = self.frames, []
            self.owner.message(frames)

    def _greeting(self) -> bool:
        got = self._view[:self._end]
        if got[0] != 0xFF:
            raise Dropped("greeting", "not a ZeroMQ peer: its first byte is not ZMTP's 0xFF")
        if len(got) >= SIGNATURE_BYTES and not got[9] & 1:
            raise Dropped("greeting", "not a ZMTP 3 peer: its signature ends without 0x7F (ZMTP 1.0)")
        if len(got) > SIGNATURE_BYTES and got[10] < 3:
            raise Dropped("version", f"the peer speaks ZMTP {got[10]}: this door speaks ZMTP 3 (libzmq 4 and later)")
        if len(got) < GREETING_BYTES:
            return False
        mechanism = bytes(got[12:32]).rstrip(b"\0")
        if mechanism != b"NULL":
            raise Dropped("mechanism", f"the peer asks for the {mechanism[:20].decode('ascii', 'replace')} "
                                       "mechanism: this door speaks NULL (Frigate's client)")
        self._start, self.stage = GREETING_BYTES, HANDSHAKE_STAGE
        return True

    def _handshake(self) -> bool:
        buf, pos, end = self._view, self._start, self._end
        if end - pos < 2:
            return False
        flags = buf[pos]
        if not flags & COMMAND or flags & (MORE | RESERVED_FLAGS):
            raise Dropped("handshake", f"the peer's first frame after its greeting (flags {flags:#04x}) is not a "
                                       "command")
        head = 9 if flags & LONG else 2
        if end - pos < head:
            return False
        size = int.from_bytes(buf[pos + 1:pos + 9], "big") if flags & LONG else buf[pos + 1]
        if size > COMMAND_MAX_BYTES:
            raise Dropped("command", f"a command of {size} bytes (at most {COMMAND_MAX_BYTES})")
        if end - pos - head < size:
            return False
        name, body = command_parts(bytes(buf[pos + head:pos + head + size]))
        if name == b"ERROR":
            why = body[1:1 + body[0]].decode("utf-8", "replace") if body else ""
            raise Dropped("handshake", f"the peer refused the handshake: {why[:80]}")
        if name != b"READY":
            raise Dropped("handshake", f"the peer's first command is {name[:20]!r}, not READY")
        properties = read_properties(body)
        peer_type = properties.get("socket-type", b"").decode("ascii", "replace")
        if peer_type not in PEER_TYPES:
            raise Dropped("socket_type", f"a {peer_type[:20] or 'nameless'} socket: this door (a ROUTER) answers "
                                         "REQ and DEALER sockets")
        self.peer_type = peer_type
        self._start, self.stage = pos + head + size, MESSAGE_STAGE
        return True

    def _command(self, data: bytes) -> None:
        name, body = command_parts(data)
        if name == b"PING":  # ZMTP 3.1 heartbeat: 2 bytes of TTL, then up to 16 of context, returned in the PONG
            self.owner.command(encode_command(b"PONG", body[2:18]))
        elif name != b"PONG":
            raise Dropped("command", f"an unexpected command {name[:20]!r}")


def command_parts(data: bytes) -> tuple[bytes, bytes]:
    """A command frame's name and body."""
    if not data or len(data) < 1 + data[0]:
        raise Dropped("command", "a command frame shorter than its name")
    return data[1:1 + data[0]], data[1 + data[0]:]


def read_properties(body: bytes) -> dict[str, bytes]:
    """READY's properties, names lower-cased (ZMTP compares them case-insensitively). Bounded by the body's size;
    a property that runs past it is a protocol error."""
    properties, pos = {}, 0
    while pos < len(body):
        length = body[pos]
        name_end = pos + 1 + length
        if length == 0 or name_end + 4 > len(body):
            raise Dropped("handshake", "a READY property runs past its command")
        value_length = int.from_bytes(body[name_end:name_end + 4], "big")
        value_end = name_end + 4 + value_length
        if value_end > len(body):
            raise Dropped("handshake", "a READY property's value runs past its command")
        properties[body[pos + 1:name_end].decode("ascii", "replace").lower()] = body[name_end + 4:value_end]
        pos = value_end
    return properties


def encode_command(name: bytes, body: bytes = b"") -> bytes:
    data = bytes([len(name)]) + name + body
    return (bytes([COMMAND, len(data)]) if len(data) < 256 else
            bytes([COMMAND | LONG]) + len(data).to_bytes(8, "big")) + data


def ready(socket_type: bytes = b"ROUTER") -> bytes:
    """Our READY: the socket type (a REQ peer checks it is REP or ROUTER) and an empty Identity, as libzmq's."""
    properties = b"".join(bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value
                          for name, value in ((b"Socket-Type", socket_type), (b"Identity", b"")))
    return encode_command(b"READY", properties)


def encode(frames: list) -> bytes:
    """A message's frames on the wire, as one string of bytes (one write)."""
    out = bytearray()
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        size = len(frame)
        more = MORE if i < last else 0
        if size < 256:
            out += bytes((more, size))
        else:
            out.append(more | LONG)
            out += size.to_bytes(8, "big")
        out += frame
    return bytes(out)
