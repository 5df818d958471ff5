"""app/frontdoors/zmtp.py, the ZMTP 3 reader, fed as asyncio's BufferedProtocol feeds it, and Frigate's message
parsing (app/frontdoors/frigate.py), both fuzzed with hypothesis: any split of the bytes gives the same messages,
any bytes give messages or a drop, never another exception, and nothing past a limit is held. The bytes come from
bench/zmtp_peer.py, written from the specification, not from the reader.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.frontdoors.frigate import (
    MAX_HEADER_DEPTH,
    ModelCheck,
    ModelUpload,
    Refused,
    Requests,
    TensorRequest,
    nesting,
    read_header,
)
from app.frontdoors.zmtp import (
    HASH,
    SCRATCH_BYTES,
    TRICKLE_READS,
    Dropped,
    FrameReader,
    ReaderLimits,
    Skipped,
    encode,
    read_properties,
    ready,
)
from bench.zmtp_peer import command, frame_head, greeting, message, ready_command

OPENING = greeting() + ready_command()


class Owner:
    """The reader's owner: every frame held up to `limit`, past it read through a hash (past=HASH) or refused (the
    reader drops the peer); messages and commands kept."""

    def __init__(self, limit: int = 1 << 20, past: int | None = None):
        self.limit, self.past = limit, past
        self.messages: list[list] = []
        self.commands: list[bytes] = []
        self.asked: list[int] = []

    def frame_limit(self, frames, size):
        self.asked.append(size)
        return self.limit if size <= self.limit or self.past is None else self.past

    def message(self, frames):
        self.messages.append(frames)

    def command(self, reply):
        self.commands.append(reply)


def feed(reader: FrameReader, data: bytes, cuts: list[int] = ()) -> None:
    """Hand `data` to the reader as the event loop would: into the buffer it gives, at most as much as it takes,
    split at `cuts` too."""
    pos, cuts = 0, sorted(set(c for c in cuts if 0 < c < len(data)))
    while pos < len(data):
        buffer = reader.buffer()
        assert len(buffer) > 0
        end = min(len(data), pos + len(buffer), next((c for c in cuts if c > pos), len(data)))
        buffer[:end - pos] = data[pos:end]
        reader.received(end - pos)
        pos = end


def as_bytes(frames: list) -> list[bytes]:
    return [bytes(f) if not isinstance(f, Skipped) else f for f in frames]


def test_a_req_peers_greeting_ready_and_messages():
    owner = Owner()
    reader = FrameReader(owner)
    feed(reader, OPENING + message([b"", b'{"a": 1}', bytes(300)]) + message([b"", b"x" * 70_000]))
    assert reader.peer_type == "REQ"
    assert [as_bytes(m) for m in owner.messages] == [[b"", b'{"a": 1}', bytes(300)], [b"", b"x" * 70_000]]
    assert read_properties(ready()[2 + 6:]) == {"socket-type": b"ROUTER", "identity": b""}


def test_a_large_frame_is_received_straight_into_its_own_buffer():
    """Past the scratch, buffer() is the frame's own array: the kernel writes there, and the frame handed over is
    that array (only the part that came with its head was copied)."""
    owner = Owner()
    reader = FrameReader(owner)
    feed(reader, OPENING + frame_head(0, more=True) + frame_head(1_000_000))
    view = reader.buffer()
    assert len(view) == 1_000_000  # nothing of its body yet: all of it goes straight in
    body = (bytes(range(256)) * 3907)[:1_000_000]
    feed(reader, body)
    frame = owner.messages[0][1]
    assert isinstance(frame, np.ndarray) and np.shares_memory(frame, np.frombuffer(view, np.uint8))
    assert frame.tobytes() == body


@pytest.mark.parametrize("opening, reason", [
    (b"GET / HTTP/1.1\r\n", "greeting"),                                  # garbage before the greeting
    (b"\xff" + bytes(8) + b"\x00", "greeting"),                           # ZMTP 1.0
    (greeting(major=2), "version"),
    (greeting(mechanism=b"CURVE"), "mechanism"),
    (greeting() + message([b"hello"]), "handshake"),                      # a message before READY
    (greeting() + frame_head(1 << 40, command=True), "command"),          # a huge command declared
    (greeting() + command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x03PUB"), "socket_type"),
    (greeting() + command(b"READY", b"\x0bSocket-Type\xff\xff\xff\xffREQ"), "handshake"),  # a value past its end
    (OPENING + b"\x10\x01x", "framing"),                                  # a reserved flag
    (OPENING + frame_head(1, more=True) + b"x" + command(b"PING", b"\0\0"), "framing"),  # a command in a message
    (OPENING + command(b"SUBSCRIBE", b"x"), "command"),
    (OPENING + frame_head((1 << 20) + 1), "frame_size"),                  # past its limit
    (OPENING + frame_head(1 << 62), "frame_size"),
])
def test_a_peer_is_dropped_at_the_first_thing_that_breaks_the_protocol(opening, reason):
    reader = FrameReader(Owner())
    with pytest.raises(Dropped) as dropped:
        feed(reader, opening)
    assert dropped.value.reason == reason, dropped.value


def test_garbage_is_refused_at_its_first_byte():
    reader = FrameReader(Owner())
    with pytest.raises(Dropped, match="not a ZeroMQ peer"):
        feed(reader, b"G")


def test_a_message_of_very_many_frames_is_dropped_at_its_limit_with_what_came_before():
    owner = Owner()
    reader = FrameReader(owner, ReaderLimits(max_frames=16))
    frames = message([b"", b'{"shape": [1]}'] + [b"x"] * 299_998)
    with pytest.raises(Dropped) as dropped:
        feed(reader, OPENING + frames)
    assert dropped.value.reason == "frames" and len(dropped.value.frames) == 16
    assert dropped.value.frames[:2] == [b"", b'{"shape": [1]}'] and not owner.messages
    assert len(owner.asked) == 16  # the 17th frame's head was the last thing read


def test_a_frame_past_its_limit_drops_its_peer_at_its_head_unless_it_is_to_be_hashed():
    body = bytes(range(256)) * 1000
    owner = Owner(limit=1000, past=HASH)
    reader = FrameReader(owner)
    feed(reader, OPENING + message([b"", b"head", body]) + message([b"", b"next"]))
    first, second = owner.messages
    assert first[:2] == [b"", b"head"] and isinstance(first[2], Skipped) and len(first[2]) == len(body)
    assert first[2].sha256 == hashlib.sha256(body).hexdigest()
    assert second == [b"", b"next"]  # the next message read as usual
    reader = FrameReader(Owner(limit=1000))
    with pytest.raises(Dropped) as dropped:
        feed(reader, OPENING + message([b"", b"head", body])[:2 + 6 + 9])  # up to the body's head, nothing of it
    assert dropped.value.reason == "frame_size" and dropped.value.frames == [b"", b"head"]


def test_a_paused_reader_hands_over_nothing_until_resumed_and_stops_reading_when_full():
    owner = Owner()
    reader = FrameReader(owner)
    feed(reader, OPENING + message([b"", b"one"]))
    reader.paused = True
    many = message([b"", b"two"]) * (SCRATCH_BYTES // 7 + 1)
    taken = 0
    while not reader.full():
        buffer = reader.buffer()
        n = min(len(buffer), len(many) - taken)
        buffer[:n] = many[taken:taken + n]
        reader.received(n)
        taken += n
    assert len(owner.messages) == 1 and taken == SCRATCH_BYTES
    reader.resume()  # one message at a time: the owner pauses again after each
    assert len(owner.messages) > 1 and owner.messages[1] == [b"", b"two"]


def test_a_large_frame_in_small_pieces_is_told_apart_from_one_sent_whole():
    whole, pieces = FrameReader(Owner()), FrameReader(Owner())
    data = OPENING + message([b"", b"head", bytes(300_000)])
    feed(whole, data)  # as large reads as the reader takes
    assert not whole.trickling()
    head = len(OPENING) + 2 + 6 + 9
    feed(pieces, data[:head + 1000])
    flags = []
    for start in range(head + 1000, head + 1000 + 40 * 512, 512):
        feed(pieces, data[start:start + 512])
        flags.append(pieces.trickling())
    assert flags.index(True) == TRICKLE_READS  # the 33rd small read of the frame
    feed(pieces, data[head + 1000 + 40 * 512:])
    assert not pieces.trickling()  # the frame done: the next one starts afresh


def test_a_ping_gets_its_pong_with_its_context():
    owner = Owner()
    feed(FrameReader(owner), OPENING + command(b"PING", b"\x00\x0acontext") + command(b"PONG", b"x"))
    assert owner.commands == [command(b"PONG", b"context")]


def test_the_encoder_writes_what_the_specification_reads():
    frames = [b"", b"x" * 255, b"y" * 256, bytes(70_000)]
    assert encode(frames) == message(frames)


# ---- fuzzed -----------------------------------------------------------------------------------------------

messages = st.lists(st.lists(st.binary(max_size=600) | st.integers(0, 40_000).map(bytes), min_size=1, max_size=6),
                    min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sent=messages, cuts=st.lists(st.integers(1, 300_000), max_size=40), limit=st.integers(0, 50_000))
def test_any_split_of_the_bytes_gives_the_same_messages(sent, cuts, limit):
    owner = Owner(limit=limit, past=HASH)
    reader = FrameReader(owner)
    feed(reader, OPENING + b"".join(message(m) for m in sent), cuts)
    got = [[f if isinstance(f, Skipped) else bytes(f) for f in m] for m in owner.messages]
    assert len(got) == len(sent)
    for frames, wanted in zip(got, sent):
        for frame, data in zip(frames, wanted, strict=True):
            if len(data) <= limit:
                assert frame == data
            else:  # past its limit, read through its hash: never held
                assert isinstance(frame, Skipped) and len(frame) == len(data)
                assert frame.sha256 == hashlib.sha256(data).hexdigest()


@settings(max_examples=300, deadline=None)
@given(noise=st.binary(max_size=3000), cuts=st.lists(st.integers(1, 3000), max_size=20))
def test_any_bytes_after_the_handshake_give_messages_or_a_drop_and_nothing_past_a_limit_is_held(noise, cuts):
    owner = Owner(limit=512)
    reader = FrameReader(owner, ReaderLimits(max_frames=16))
    try:
        feed(reader, OPENING + noise, [c + len(OPENING) for c in cuts])
    except Dropped as dropped:
        assert dropped.reason in {"framing", "command", "frames", "frame_size"}
    for frames in owner.messages:
        assert len(frames) <= 16
        assert all(len(f) <= 512 for f in frames)
    assert reader._frame is None or len(reader._frame) <= 512  # a frame under way is one within its limit


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3), max_leaves=20)


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_nesting_is_the_depth_of_any_json_text_counted_without_parsing(value):
    assert nesting(json.dumps(value).encode()) == depth_of(value)


headers = st.fixed_dictionaries({}, optional={
    "shape": st.lists(st.integers(-2, 400), max_size=5) | st.text(max_size=4) | st.none(),
    "dtype": st.sampled_from(["uint8", "int8", "float32", "float64", "complex64", "object", "U5", "nope", ""])
    | st.integers(),
    "model_type": st.sampled_from(["ssd", "yologeneric", "yolox", "banana"]) | st.integers(),
    "model_request": st.booleans(), "model_data": st.booleans(),
    "model_name": st.text(max_size=12) | st.integers(),
})


@settings(max_examples=400, deadline=None)
@given(header=headers | json_values,
       payload=st.binary(max_size=2000) | st.integers(0, 500_000).map(lambda n: Skipped(n, "0" * 64)),
       extra=st.lists(st.binary(max_size=4), max_size=2), raw=st.booleans())
def test_any_message_is_read_as_a_request_or_refused_with_a_reason(header, payload, extra, raw):
    first = json.dumps(header).encode() if not raw else json.dumps(header).encode()[::-1]
    frames = [first, payload, *extra]
    requests = Requests()
    for _ in range(2):  # once read, once from the cache
        try:
            read, request = requests.read(frames)
        except Refused as refused:
            assert refused.reason in {"header", "frames", "size", "dtype", "model_type"} and refused.message
            continue
        assert isinstance(read, dict) and isinstance(request, (ModelCheck, ModelUpload, TensorRequest))
        if isinstance(request, TensorRequest):
            assert request.shape and len(payload) == np.prod(request.shape) * request.dtype.itemsize
        assert requests.peek(first) == read


def test_a_deep_or_large_header_is_refused_before_the_decoder_sees_it():
    deep = b'{"a": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    assert len(deep) < 4096 + 10
    with pytest.raises(Refused, match=f"nests 2001 levels deep: at most {MAX_HEADER_DEPTH}"):
        read_header(deep)
    with pytest.raises(Refused, match="a header is at most 4096"):
        read_header(b"{" + b" " * 5000 + b"}")
    with pytest.raises(Refused, match="not a JSON object"):
        read_header(b'"[[[[[[[[[[[[[[[["')  # brackets inside a string are no nesting
