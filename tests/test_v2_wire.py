"""The v2 wire format on its own: request bodies in every form tritonclient sends, responses back."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import numpy as np
import pytest

from app.api.v2.wire import (
    OutputTensor,
    classification,
    decompress,
    encode_response,
    parse_infer_request,
)
from app.errors import BodyTooLarge, RequestError
from tests.hostile_json import HOSTILE_BODIES


def _binary_body(header: dict, *blobs: bytes) -> tuple[bytes, str]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), str(len(head))


def test_json_tensor_is_reshaped_row_major():
    body = json.dumps({"id": "r1", "inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 2, 2, 1],
                                                "data": [1, 2, 3, 4]}]}).encode()
    req = parse_infer_request(body, None)
    assert req.id == "r1" and req.outputs is None and not req.binary_default
    tensor = req.inputs[0]
    assert tensor.data.dtype == np.uint8 and tensor.data.tolist() == [[[[1], [2]], [[3], [4]]]]


def test_binary_tensor_and_bytes_elements_follow_the_json_header():
    pixels = np.arange(12, dtype=np.int8).reshape(1, 2, 2, 3)
    images = [b"\x89PNG...", b"\xff\xd8jpeg"]
    packed = b"".join(struct.pack("<I", len(e)) + e for e in images)
    header = {"inputs": [
        {"name": "t", "datatype": "INT8", "shape": [1, 2, 2, 3], "parameters": {"binary_data_size": 12}},
        {"name": "b", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(packed)}}],
        "outputs": [{"name": "scores", "parameters": {"classification": 3, "binary_data": True}}]}
    body, length = _binary_body(header, pixels.tobytes(), packed)
    req = parse_infer_request(body, length)
    assert np.array_equal(req.inputs[0].data, pixels)
    assert req.inputs[1].data == images
    assert req.outputs[0].classification == 3 and req.outputs[0].binary


def test_json_bytes_as_base64_when_the_input_says_so():
    body = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["AAEC/w=="],
                                   "parameters": {"content_type": "base64"}}]}).encode()
    assert parse_infer_request(body, None).inputs[0].data == [b"\x00\x01\x02\xff"]


@pytest.mark.parametrize("encoding, compress", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),  # what tritonclient sends for "deflate": zlib-wrapped
    ("deflate", lambda b: _raw_deflate(b)),  # and what some other clients send: raw deflate
])
def test_compressed_bodies_inflate(encoding, compress):
    body = b'{"inputs": []}' * 100
    assert decompress(compress(body), encoding, 10_000) == body


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


def test_a_gzip_bomb_stops_at_the_limit():
    bomb = gzip.compress(b"\0" * 5_000_000)
    with pytest.raises(BodyTooLarge, match="inflates past the limit of 1000000"):
        decompress(bomb, "gzip", 1_000_000)


@pytest.mark.parametrize("body, header, message", [
    (b"not json", None, "not valid JSON"),
    (b"[1]", None, "JSON object"),
    (b'{"inputs": []}', None, "non-empty list 'inputs'"),
    (b'{"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}', None, "datatype 'FP8'"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [-1], "data": [1]}]}', None, "non-negative"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [3], "data": [1, 2]}]}', None, "has 2 values"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]}', None, "range 0..255"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1.5]}]}', None, "integers"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": ["a"]}]}', None, "must be numbers"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1]}]}', None, "needs 'data'"),
    (b'{}', "99", "Inference-Header-Content-Length is 99"),
    # 2^32 * 2^32 wraps to 0 in int64: the count must be exact, or an empty list would pass
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [4294967296, 4294967296], "data": []}]}', None,
     "needs 18446744073709551616"),
    (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [1]}], '
     b'"outputs": [{"name": "s", "parameters": {"classification": 0}}]}', None, "positive integer"),
])
def test_malformed_requests_say_what_is_wrong(body, header, message):
    with pytest.raises(RequestError, match=message):
        parse_infer_request(body, header)


@pytest.mark.parametrize("body, message", [case[1:] for case in HOSTILE_BODIES],
                         ids=[case[0] for case in HOSTILE_BODIES])
def test_hostile_json_gets_a_request_error_that_says_why(body, message):
    with pytest.raises(RequestError) as refused:
        parse_infer_request(body, None)
    assert message in str(refused.value)
    assert len(str(refused.value)) < 300  # the client's value is quoted, not echoed whole


@pytest.mark.parametrize("header, tail, message", [
    ({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}}]}, b"xy",
     "runs past the end"),
    ({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [1]}]}, b"tail", "after the last"),
    ({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [3], "parameters": {"binary_data_size": 2}}]}, b"ab",
     "needs 3"),
])
def test_binary_sizes_must_add_up(header, tail, message):
    with pytest.raises(RequestError, match=message):
        parse_infer_request(*_binary_body(header, tail))


def test_truncated_bytes_element_is_refused():
    header = {"inputs": [{"name": "b", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]}
    body, length = _binary_body(header, struct.pack("<I", 10) + b"ab")
    with pytest.raises(RequestError, match="runs past its binary data"):
        parse_infer_request(body, length)


def test_classification_is_score_index_label_best_first_ties_in_class_order():
    values = np.array([0.1, 0.5, 0.2, 0.5], np.float32)
    assert classification(values, 3, ("a", "b", "c", "d")) == [b"0.5:1:b", b"0.5:3:d", b"0.20000000298023224:2:c"]
    assert classification(np.array([3, 9], np.uint8), 1, ("x", "y")) == [b"9:1:y"]


def test_response_json_and_binary_forms():
    scores = np.array([[0.25, 0.75]], np.float32)
    labels = [b"0.75:1:dog"]
    json_body, headers = encode_response("m", "1", "abc", [OutputTensor("scores", "FP32", (1, 2), scores, False)],
                                         {"total_ms": 1.5})
    assert headers == {"content-type": "application/json"}
    doc = json.loads(json_body)
    assert doc == {"model_name": "m", "model_version": "1", "id": "abc", "parameters": {"total_ms": 1.5},
                   "outputs": [{"name": "scores", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}]}
    body, headers = encode_response("m", None, None, [OutputTensor("scores", "FP32", (1, 2), scores, True),
                                                       OutputTensor("top", "BYTES", (1, 1), labels, True)], {})
    length = int(headers["inference-header-content-length"])
    doc = json.loads(body[:length])
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [8, 4 + len(labels[0])]
    rest = body[length:]
    assert np.frombuffer(rest[:8], "<f4").tolist() == [0.25, 0.75]
    assert rest[8:] == struct.pack("<I", len(labels[0])) + labels[0]
