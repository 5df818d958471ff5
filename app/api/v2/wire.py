"""The Open Inference Protocol (KServe v2) REST wire format, without the web framework.

Request bodies: JSON, optionally followed by the binary tensor extension's raw bytes (the JSON
part's length in the `Inference-Header-Content-Length` header, each binary tensor's length in
its `parameters.binary_data_size`), optionally gzip- or deflate-compressed as a whole
(`Content-Encoding`), as tritonclient sends them. Responses: the same two forms; outputs go
binary when the request asks (`parameters.binary_data_output`, or per output
`parameters.binary_data`). BYTES elements in binary form are each a 4-byte little-endian
length followed by the bytes.

Every problem with a body is a RequestError (400) whose message says what was got and what
was expected; nothing here knows about models. Hostile JSON included: nesting deeper than the
decoder's stack or a tensor's rank, numbers of thousands of digits, NaN and Infinity (not JSON),
a key given twice (which one counts would be a guess); values quoted in messages are cut short.
"""

from __future__ import annotations

import binascii
import json
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from app.errors import BodyTooLarge, RequestError
from app.tasks.classify import top_order

HEADER_LENGTH = "inference-header-content-length"
# The deepest tensor the wire takes: nested `data` mirrors the shape, so no deeper either (numpy's own
# ceiling is 64 dimensions; models here have rank 4 at most).
MAX_RANK = 32
# How much of a client's value an error message quotes (fixed: a message, not a resource).
SHOWN_CHARS = 60
BINARY_CONTENT_TYPE = "application/octet-stream"

# OIP datatype -> numpy dtype (little-endian, as the binary extension defines it). BYTES is separate.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BYTES = "BYTES"


def datatype_of(dtype: np.dtype) -> str:
    """numpy dtype -> OIP datatype name."""
    for name, candidate in DTYPES.items():
        if np.dtype(dtype).newbyteorder("<") == candidate.newbyteorder("<"):
            return name
    raise ValueError(f"no OIP datatype for numpy {dtype}")


@dataclass(frozen=True)
class Tensor:
    """A tensor as the protocol names it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    # numeric tensors: an ndarray of `shape`; BYTES: a flat list of bytes, one per element
    data: np.ndarray | list[bytes]


@dataclass(frozen=True)
class InputTensor(Tensor):
    parameters: dict


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool
    classification: int | None  # the classification extension's k, when asked


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: list[InputTensor]
    # None: every output of the model, in the form `binary_default` says
    outputs: list[RequestedOutput] | None
    binary_default: bool
    parameters: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OutputTensor(Tensor):
    binary: bool  # sent as binary data (the extension), not as JSON


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo Content-Encoding gzip or deflate (zlib-wrapped or raw), never past `limit` bytes."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding == "gzip":
        attempts = (16 + zlib.MAX_WBITS,)
    elif encoding == "deflate":  # RFC 9110 says zlib-wrapped; some clients send raw deflate
        attempts = (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    else:
        raise RequestError(f"Content-Encoding {encoding!r} is not accepted; use gzip, deflate or none")
    for wbits in attempts:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as e:
            error = e
            continue
        if len(out) > limit:
            raise BodyTooLarge(f"the {encoding} request body inflates past the limit of {limit} bytes")
        if not inflater.eof:
            raise RequestError(f"the {encoding} request body is truncated")
        return out
    raise RequestError(f"the request body is not valid {encoding} data: {error}")


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """Bytes of a (decompressed) POST .../infer body -> InferRequest."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise RequestError(f"Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if not 0 <= length <= len(body):
            raise RequestError(f"Inference-Header-Content-Length is {length}; the body has {len(body)} bytes")
        json_part, binary = body[:length], body[length:]
    doc = _json(json_part, header_length)
    if not isinstance(doc, dict):
        raise RequestError("the inference request must be a JSON object with 'inputs'")
    parameters = _parameters(doc.get("parameters"), "request")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError("the inference request needs a non-empty list 'inputs'")
    offset = 0
    inputs = []
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _input(raw, i, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise RequestError(f"the body has {len(binary) - offset} bytes after the last binary tensor "
                           "(binary_data_size of the inputs and the body length disagree)")
    binary_default = _bool(parameters.get("binary_data_output", False), "parameters.binary_data_output")
    outputs = None
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise RequestError("'outputs' must be a list")
        outputs = [_requested_output(raw, i, binary_default) for i, raw in enumerate(doc["outputs"])]
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(f"'id' must be a string, got {type(request_id).__name__}")
    return InferRequest(request_id, inputs, outputs, binary_default, parameters)


def _json(text: bytes, header_length: str | None):
    try:
        return json.loads(text, parse_constant=_not_json, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise RequestError("the inference request nests arrays or objects too deeply to parse "
                           f"(a tensor has at most {MAX_RANK} dimensions)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = "" if header_length else " (binary tensors need the Inference-Header-Content-Length header)"
        raise RequestError(f"the inference request is not valid JSON: {_cut(str(e))}{hint}") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise RequestError(f"the inference request holds a number too long to read: {_cut(str(e))}") from None


def _not_json(token: str):
    raise RequestError(f"the inference request is not valid JSON: {token} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise RequestError(f"the inference request gives the key {_shown(twice)} twice in one object")
    return doc


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _shown(value) -> str:
    """A client's value as an error message quotes it: repr, cut short."""
    return _cut(repr(value))


def _parameters(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{where} 'parameters' must be an object")
    return value


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{where} must be true or false, got {_shown(value)}")
    return value


def _input(raw, i: int, binary: bytes, offset: int) -> tuple[InputTensor, int]:
    if not isinstance(raw, dict):
        raise RequestError(f"inputs[{i}] must be an object with name, shape, datatype and data")
    name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
    where = f"input {_shown(name)}" if isinstance(name, str) else f"inputs[{i}]"
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}: 'name' must be a non-empty string")
    if datatype != BYTES and datatype not in DTYPES:
        raise RequestError(f"{where}: datatype {_shown(datatype)} is not one of {sorted([*DTYPES, BYTES])}")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                               for d in shape)):
        raise RequestError(f"{where}: 'shape' must be a list of non-negative integers, got {_shown(shape)}")
    if len(shape) > MAX_RANK:
        raise RequestError(f"{where}: 'shape' has {len(shape)} dimensions; at most {MAX_RANK}")
    shape = tuple(shape)
    count = math.prod(shape)  # exact: numpy's int64 product would wrap on a hostile shape
    parameters = _parameters(raw.get("parameters"), where)
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RequestError(f"{where}: binary_data_size must be a non-negative integer, got {_shown(size)}")
        if "data" in raw:
            raise RequestError(f"{where}: has both 'data' and binary_data_size; send one")
        if offset + size > len(binary):
            raise RequestError(f"{where}: binary_data_size {size} runs past the end of the body "
                               f"({len(binary) - offset} bytes left)")
        chunk = binary[offset:offset + size]
        data = _bytes_elements(chunk, count, where) if datatype == BYTES else _from_buffer(chunk, datatype, shape,
                                                                                           where)
        return InputTensor(name, datatype, shape, data, parameters), offset + size
    if "data" not in raw:
        raise RequestError(f"{where}: needs 'data' (or parameters.binary_data_size with a binary body)")
    if datatype == BYTES:
        data = _json_bytes(raw["data"], count, parameters, where)
    else:
        data = _from_json(raw["data"], datatype, shape, count, where)
    return InputTensor(name, datatype, shape, data, parameters), offset


def _from_buffer(chunk: bytes, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    dtype = DTYPES[datatype]
    expected = math.prod(shape) * dtype.itemsize
    if len(chunk) != expected:
        raise RequestError(f"{where}: {len(chunk)} bytes of binary data; {datatype} {list(shape)} "
                           f"needs {expected}")
    return np.frombuffer(chunk, dtype).reshape(shape)


def _from_json(data, datatype: str, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    """Flat or nested JSON numbers -> an array of `shape` (row-major, as the protocol says)."""
    dtype = DTYPES[datatype]
    _check_depth(data, where)
    try:
        values = np.asarray(data)
    except ValueError:
        raise RequestError(f"{where}: 'data' is a ragged nested list") from None
    if values.size != count:
        raise RequestError(f"{where}: 'data' has {values.size} values; shape {list(shape)} needs {count}")
    if count and values.dtype.kind not in "biuf":
        raise RequestError(f"{where}: 'data' of a {datatype} tensor must be numbers")
    values = values.reshape(shape)
    if dtype.kind in "iu" and count:
        if values.dtype.kind == "f" and not np.array_equal(values, np.floor(values)):
            raise RequestError(f"{where}: {datatype} data must be integers")
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise RequestError(f"{where}: values outside {datatype}'s range {info.min}..{info.max}")
    return values.astype(dtype)


def _json_bytes(data, count: int, parameters: dict, where: str) -> list[bytes]:
    """BYTES in JSON: UTF-8 strings, or base64 strings when parameters.content_type is "base64"."""
    flat = list(_flatten(data, where))
    if len(flat) != count:
        raise RequestError(f"{where}: 'data' has {len(flat)} elements; the shape needs {count}")
    if not all(isinstance(v, str) for v in flat):
        raise RequestError(f"{where}: BYTES data in JSON must be strings")
    if parameters.get("content_type") == "base64":
        try:
            return [binascii.a2b_base64(v) for v in flat]
        except binascii.Error as e:
            raise RequestError(f"{where}: not base64: {e}") from None
    return [v.encode("utf-8", "surrogateescape") for v in flat]


def _check_depth(data, where: str) -> None:
    """Nested `data` deeper than a tensor can be, along its first elements: a clear 400 before
    numpy's (deeper elsewhere: numpy's ragged-list error, a 400 too)."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        if depth > MAX_RANK:
            raise RequestError(f"{where}: 'data' is nested more than {MAX_RANK} lists deep; "
                               "a tensor has at most that many dimensions")
        data = data[0] if data else None


def _flatten(data, where: str = "data"):
    """The leaves of nested lists, in order; no recursion (the nesting is the client's)."""
    stack = [iter([data])]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            if len(stack) > MAX_RANK:
                raise RequestError(f"{where}: 'data' is nested more than {MAX_RANK} lists deep; "
                                   "a tensor has at most that many dimensions")
            stack.append(iter(item))
        else:
            yield item


_END = object()


def _bytes_elements(chunk: bytes, count: int, where: str) -> list[bytes]:
    """The binary BYTES layout: per element, a 4-byte little-endian length, then the bytes."""
    elements, offset = [], 0
    while offset < len(chunk):
        if offset + 4 > len(chunk):
            raise RequestError(f"{where}: BYTES data ends inside an element's 4-byte length")
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4
        if offset + length > len(chunk):
            raise RequestError(f"{where}: a BYTES element of {length} bytes runs past its binary data")
        elements.append(chunk[offset:offset + length])
        offset += length
    if len(elements) != count:
        raise RequestError(f"{where}: {len(elements)} BYTES elements; the shape needs {count}")
    return elements


def _requested_output(raw, i: int, binary_default: bool) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise RequestError(f"outputs[{i}] must be an object with a 'name'")
    where = f"output {_shown(raw['name'])}"
    parameters = _parameters(raw.get("parameters"), where)
    binary = _bool(parameters.get("binary_data", binary_default), f"{where}: parameters.binary_data")
    k = parameters.get("classification")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise RequestError(f"{where}: parameters.classification must be a positive integer, got {_shown(k)}")
    return RequestedOutput(raw["name"], binary, k)


def classification(values: np.ndarray, k: int, labels: tuple[str, ...]) -> list[bytes]:
    """The classification extension for one row: the k best as b"score:index:label", best first
    (equal scores in class order), each score as the output tensor holds it."""
    out = []
    for i in top_order(values.astype(np.float64), k):
        label = labels[i] if i < len(labels) else ""
        value = values[i]
        text = repr(float(value)) if values.dtype.kind == "f" else str(int(value))
        out.append(f"{text}:{int(i)}:{label}".encode())
    return out


def encode_response(model_name: str, model_version: str | None, request_id: str | None,
                    outputs: list[OutputTensor], parameters: dict) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: plain JSON, or JSON + binary outputs (with the header)."""
    described, blobs = [], []
    for out in outputs:
        entry = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        if out.binary:
            blob = _encode_bytes(out.data) if out.datatype == BYTES else _to_le(out.data).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif out.datatype == BYTES:
            entry["data"] = [v.decode("utf-8", "replace") for v in out.data]
        else:
            entry["data"] = out.data.reshape(-1).tolist()
        described.append(entry)
    doc = {"model_name": model_name, "outputs": described, "parameters": parameters}
    if model_version is not None:
        doc["model_version"] = model_version
    if request_id is not None:
        doc["id"] = request_id
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {"content-type": BINARY_CONTENT_TYPE,
                                      "inference-header-content-length": str(len(header))}


def _encode_bytes(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _to_le(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("<"), copy=False)
