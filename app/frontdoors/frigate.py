"""Frigate's ZMQ detector protocol, as messages: what a request says, and the replies (no socket here: the door
that speaks it over ZeroMQ is app/frontdoors/zmq_door.py). Read from Frigate's own client,
frigate/detectors/plugins/zmq_ipc.py (a REQ socket), and its reference server frigate-nvr/apple-silicon-detector.

Requests (each one multipart, the first frame a JSON object):

    [{"model_request": true, "model_name": NAME}]            -> [{"model_available": bool, "model_loaded": bool, ...}]
    [{"model_data": true, "model_name": NAME}, FILE_BYTES]    -> [{"model_saved": bool, "model_loaded": bool, ...}]
    [{"shape": [1, H, W, 3], "dtype": "uint8", "model_type": "ssd"}, TENSOR_BYTES]
                                                              -> [480 bytes]

NAME is the base name of Frigate's `model.path`. A tensor is C-order NHWC at the model's size. A reply's rows are
[class_id, score, ymin, xmin, ymax, xmax], normalized to the input, float32 [20, 6], unused rows zero, as one
480-byte frame; Frigate reads the multipart form [{"shape": [20, 6], "dtype": "float32"}, 480 bytes] the same way,
and reads any error, timeout or reply it cannot parse as "no objects" (after a timeout it re-creates its socket and
asks for its model again).

A request this door refuses still gets a reply, never silence: zero rows in the multipart form with the reason in
the header's "error" (what the reference server sends), or 480 zero bytes alone where the first frame is not JSON
at all; a model message gets its JSON answer with the reason in "message". `Refused` carries the reason as a short
label for /metrics and the log, and the status the HTTP doors would give for the same fault.

A header is read only once it is known to be small (MAX_HEADER_BYTES) and shallow (MAX_HEADER_DEPTH, counted
without recursion and without parsing: `nesting`), so that no header makes the JSON decoder recurse.

`model_type`: Frigate sends its ModelTypeEnum's *name* (so `yolo-generic` arrives as "yologeneric"; before Frigate
0.16.1 no model_type at all). The rows are the same whatever the family, so the type is checked against the
model's family (MODEL_TYPES): what this door cannot run is refused with the reason, never decoded as something else.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from app.frontdoors.zmtp import Skipped

ROWS, COLUMNS = 20, 6
REPLY_BYTES = ROWS * COLUMNS * 4
ZERO_ROWS = bytes(REPLY_BYTES)
# Frigate's SSD rule (frigate/detectors/detector_utils.py tflite_detect_raw): rows in the model's order, up to the
# first score below this, at most ROWS of them
SSD_MIN_SCORE = 0.4
# A JSON header bigger than this is not a header Frigate wrote (its own are under 100 bytes)
MAX_HEADER_BYTES = 4096
# Nor one that nests deeper (Frigate's: an object holding a list, 2)
MAX_HEADER_DEPTH = 8
# Tensor headers remembered as read (Requests): Frigate sends one per model size and type, the same bytes every frame
HEADERS_KEPT = 64

# Frigate's model_type (as its header spells it) -> the family of model this door answers it with; None: refused
MODEL_TYPES: dict[str, str | None] = {
    "ssd": "ssd",
    "yolo-generic": "yolo",
    "yologeneric": "yolo",
    "yolox": None,
    "yolonas": None,
    "dfine": None,
    "rfdetr": None,
}
NOT_RUN_HERE = ("{model_type} models are ONNX graphs with float heads that the Edge TPU does not run; give Frigate a "
                "full-integer .tflite SSD detector (model_type: ssd), such as the SSD files its image ships")


class Refused(Exception):
    """A request answered without running a model: `reason` a short label (metrics, log), `message` what the
    client is told, `status` the HTTP status the other doors give the same fault."""

    def __init__(self, reason: str, message: str, status: int = 400, header: dict | None = None):
        super().__init__(message)
        self.reason, self.message, self.status = reason, message, status
        self.header = header  # the request's header, where it was read (the reply's form follows it)


@dataclass(frozen=True)
class ModelCheck:
    name: str


@dataclass(frozen=True)
class ModelUpload:
    name: str
    data: memoryview


@dataclass(frozen=True)
class TensorRequest:
    shape: tuple[int, ...]
    dtype: np.dtype
    model_type: str | None
    data: memoryview

    def tensor(self) -> np.ndarray:
        """The bytes as the tensor they are (no copy); the caller has checked the size against the model's."""
        return np.frombuffer(self.data, dtype=self.dtype).reshape(self.shape)


# JSON string literals (escapes included), and a table that keeps only brackets: [ and { as 1, ] and } as -1
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def nesting(data: bytes) -> int:
    """How deep a JSON text's arrays and objects nest: its brackets outside string literals, summed in order (a
    cumulative sum, no recursion and no parse). A text that is no JSON gets some number; the parser refuses it."""
    brackets = _STRINGS.sub(b"", data).translate(_BRACKETS, _NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(np.frombuffer(brackets, np.int8), dtype=np.int32).max())


def read_header(frame) -> dict:
    """The first frame as Frigate's JSON header; Refused("header") saying why it is not one."""
    size = len(frame)
    if isinstance(frame, Skipped) or size > MAX_HEADER_BYTES:
        raise Refused("header", f"the first frame has {size} bytes: a header is at most {MAX_HEADER_BYTES} (Frigate's "
                                "are under 100)")
    data = bytes(frame)
    depth = nesting(data)
    if depth > MAX_HEADER_DEPTH:
        raise Refused("header", f"the header nests {depth} levels deep: at most {MAX_HEADER_DEPTH} are read "
                                "(Frigate's nest 2)")
    try:
        header = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise Refused("header", "the first frame is not a JSON object: Frigate's requests start with a JSON header")
    return header


def header_problem(frame) -> str:
    """Why a first frame is no header (read_header's refusal), for an answer given before its message has ended."""
    try:
        read_header(frame)
    except Refused as refused:
        return refused.message
    return "the header was read"


def header_of(frames: list) -> dict | None:
    """The first frame as Frigate's JSON header, or None when it is not one."""
    try:
        return read_header(frames[0]) if frames else None
    except Refused:
        return None


def looks_like_json(frames: list) -> bool:
    """Whether the first frame starts as a JSON object would: a refusal then says why in the JSON form."""
    if not frames:
        return False
    first = frames[0]
    return isinstance(first, Skipped) or bytes(first[:64]).lstrip()[:1] == b"{"  # one too large: said in JSON


def parse(frames: list, header: dict | None = None) -> ModelCheck | ModelUpload | TensorRequest:
    """What the request asks, or Refused with the reason (and the header, where it was read). `header`: the first
    frame as read_header() reads it, where the caller has it."""
    if not frames:
        raise Refused("frames", "an empty message")
    if header is None:
        header = read_header(frames[0])
    try:
        return _parsed(frames, header)
    except Refused as refused:
        refused.header = header
        raise


def _parsed(frames: list, header: dict) -> ModelCheck | ModelUpload | TensorRequest:
    if header.get("model_request"):
        _frames(frames, 1, "a model_request")
        return ModelCheck(_model_name(header))
    if header.get("model_data"):
        _frames(frames, 2, "a model_data message (the header, then the model file)")
        return ModelUpload(_model_name(header), frames[1])
    _frames(frames, 2, "a tensor request (the header, then the tensor's bytes)")
    shape, dtype = tensor_type(header)
    expected = math.prod(shape) * dtype.itemsize
    if len(frames[1]) != expected:
        raise Refused("size", f"the tensor frame has {len(frames[1])} bytes; {dtype.name} {list(shape)} is {expected}")
    return TensorRequest(shape, dtype, header.get("model_type"), frames[1])


def tensor_type(header: dict) -> tuple[tuple[int, ...], np.dtype]:
    """A tensor request's shape and dtype, checked; Refused saying what is wrong."""
    shape, dtype = header.get("shape"), header.get("dtype")
    if not (isinstance(shape, list) and 1 <= len(shape) <= 8
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 16 for d in shape)):
        raise Refused("header", f"the header's shape {str(shape)[:80]} is not a list of sizes, e.g. [1, 320, 320, 3]")
    try:
        dtype = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "uif":
        raise Refused("dtype", f"the header's dtype {str(header.get('dtype'))[:40]!r} is not a numeric dtype, "
                               "e.g. uint8")
    model_type = header.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise Refused("model_type", f"model_type {str(model_type)[:40]} is not a name")
    return tuple(shape), dtype


class Requests:
    """parse() with each tensor request's header read once: Frigate sends the same header bytes with every frame,
    so a header seen before is one dict lookup, and only the tensor frame's size is checked again (the JSON and the
    checks took about 80 us of the event loop's time per request, cold, on 2 cores). HEADERS_KEPT headers at most,
    forgotten all at once when full."""

    def __init__(self, kept: int = HEADERS_KEPT):
        self.kept = kept
        # header bytes -> the header, and its tensor's shape, dtype, model_type and size in bytes
        self._tensors: dict[bytes, tuple[dict, tuple[int, ...], np.dtype, str | None, int]] = {}

    def peek(self, frame) -> dict | None:
        """The header a first frame holds, or None where it holds none (it is refused once the message is whole).
        For the door's limits while the message's next frame arrives."""
        if isinstance(frame, bytes):
            known = self._tensors.get(frame)
            if known is not None:
                return known[0]
        try:
            return read_header(frame)
        except Refused:
            return None

    def read(self, frames: list) -> tuple[dict, ModelCheck | ModelUpload | TensorRequest]:
        """(its header, what the request asks), or Refused saying why (with the header, where it was read)."""
        first = frames[0] if frames else None
        known = self._tensors.get(first) if len(frames) == 2 and isinstance(first, bytes) else None
        if known is not None:
            header, shape, dtype, model_type, size = known
            if len(frames[1]) != size:
                parse(frames, header)  # Refused, saying why
            return header, TensorRequest(shape, dtype, model_type, frames[1])
        header = read_header(first) if frames else None
        request = parse(frames, header)
        if isinstance(request, TensorRequest) and isinstance(first, bytes):
            if len(self._tensors) >= self.kept:
                self._tensors.clear()
            self._tensors[first] = header, request.shape, request.dtype, request.model_type, len(frames[1])
        return header, request


def _frames(frames: list, wanted: int, what: str) -> None:
    if len(frames) != wanted:
        raise Refused("frames", f"{what} has {wanted} frame(s), this one {len(frames)}")


def _model_name(header: dict) -> str:
    name = header.get("model_name")
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise Refused("header", "the header has no model_name (the base name of Frigate's model.path)")
    return name.strip()


def family_for(model_type: str | None, family: str) -> None:
    """Refused unless a model of `family` answers Frigate's `model_type` (None: an older Frigate that sends none)."""
    if model_type is None:
        return
    if model_type not in MODEL_TYPES:
        raise Refused("model_type", f"unknown model_type {model_type[:40]!r}: Frigate's are "
                                    f"{', '.join(t for t in MODEL_TYPES if t != 'yologeneric')}")
    wanted = MODEL_TYPES[model_type]
    if wanted is None:
        raise Refused("model_type", NOT_RUN_HERE.format(model_type=model_type))
    if wanted != family:
        raise Refused("model_type", f"model_type {model_type} asks for a model of the {wanted} family, and this one "
                                    f"is of the {family} family: set Frigate's model_type to {_type_of(family)}")


def _type_of(family: str) -> str:
    return next((t for t, f in MODEL_TYPES.items() if f == family), family)


# ---- replies ------------------------------------------------------------------------------------------------

def rows_reply(rows: np.ndarray) -> list[bytes]:
    """Rows in the single-frame form Frigate reads as readily as the multipart one: a frame less to send (about 10 us
    of CPU a reply on each side, measured with pyzmq 27 here)."""
    return [np.ascontiguousarray(rows, np.float32).tobytes()]


def zero_reply(error: Refused | None, json_form: bool) -> list[bytes]:
    """Zero rows: with a header naming the reason where the request came with a JSON header (or one that started as
    JSON), else 480 bytes alone."""
    if not json_form:
        return [ZERO_ROWS]
    body = {"shape": [ROWS, COLUMNS], "dtype": "float32"}
    if error is not None:
        body["error"] = error.message
    return [json.dumps(body).encode(), ZERO_ROWS]


def model_reply(**fields) -> list[bytes]:
    return [json.dumps(fields).encode()]


def ssd_rows(boxes: np.ndarray, classes: np.ndarray, scores: np.ndarray, count) -> np.ndarray:
    """Frigate's SSD rule on TFLite_Detection_PostProcess's outputs: the first `count` rows in the model's order,
    stopping at the first score below SSD_MIN_SCORE, at most ROWS; each [class, score, ymin, xmin, ymax, xmax].
    Few numpy calls (the scores compared as Python floats): at one client each runs cold, after the event loop
    waited for the device, and this took 130 us of it on 2 cores where it took 13 us warm (now 80 and 4)."""
    scores = scores.reshape(-1)
    count = np.asarray(count).item(0)
    n = int(min(max(count, 0.0), ROWS, len(scores))) if math.isfinite(count) else 0
    for i, score in enumerate(scores[:n].tolist()):
        if score < SSD_MIN_SCORE:
            n = i
            break
    rows = np.zeros((ROWS, COLUMNS), np.float32)
    rows[:n, 0] = classes.reshape(-1)[:n]
    rows[:n, 1] = scores[:n]
    rows[:n, 2:] = boxes.reshape(-1, 4)[:n]
    return rows
