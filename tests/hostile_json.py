"""Hostile v2 inference bodies, each with the words its 400 must say: shared by the wire's unit
tests (tests/test_v2_wire.py) and the live service's (tests/test_openapi_fuzz.py)."""

from __future__ import annotations

import json

DEPTH = 100_000  # far past Python's recursion limit: the decoder's own stack gives out first


def _infer(data: str, shape: str = "[1]", datatype: str = "UINT8", extra: str = "") -> bytes:
    return (f'{{"inputs": [{{"name": "image", "shape": {shape}, "datatype": "{datatype}", "data": {data}}}]'
            f'{extra}}}').encode()


# (case id, body, words the error message must hold)
HOSTILE_BODIES: list[tuple[str, bytes, str]] = [
    ("deep arrays", b'{"inputs": ' + b"[" * DEPTH + b"]" * DEPTH + b"}", "too deeply"),
    ("deep objects", b'{"parameters": ' + b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH + b"}", "too deeply"),
    ("deep data within the decoder's reach", _infer("[" * 500 + "1" + "]" * 500), "nested more than 32"),
    ("deep BYTES data", _infer("[" * 500 + '"a"' + "]" * 500, datatype="BYTES"), "nested more than 32"),
    ("a shape of 100 dimensions", _infer("[]", shape=json.dumps([0] * 100)), "100 dimensions"),
    ("deep shape", _infer("[1]", shape="[" * 500 + "]" * 500), "non-negative integers, got [[[["),
    ("a number of 100,000 digits", _infer("[" + "9" * 100_000 + "]"), "number too long"),
    ("a huge float", _infer("[1e999]"), "range 0..255"),
    ("NaN", _infer("[NaN]"), "NaN is not a JSON number"),
    ("Infinity", _infer("[-Infinity]", datatype="FP32"), "-Infinity is not a JSON number"),
    ("a key twice", _infer("[1]", extra=', "inputs": []'), "key 'inputs' twice"),
    ("wide objects", _infer("[" + ",".join(["{}"] * 100_000) + "]", shape="[100000]"), "must be numbers"),
    ("wide empty lists", _infer("[" + ",".join(["[]"] * 100_000) + "]", shape="[100000]"), "has 0 values"),
]
