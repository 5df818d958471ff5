"""The base64 image of a JSON body found and decoded in place (app/api/json_image.py): against json.loads and
base64.b64decode(validate=True) on what hypothesis makes, small chunks included, and the bounds it keeps."""

from __future__ import annotations

import base64
import binascii
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.json_image import MAX_DEPTH, REST_BYTES, Base64InPlace, NotBase64, locate
from app.errors import BodyTooLarge, RequestError


def decoded(text: bytes, chunk_chars: int) -> bytes:
    """`text` (a JSON string's content) decoded in place, at the end of a buffer as in a body."""
    buffer = bytearray(b'{"data": "' + text + b'"}')
    decoding = Base64InPlace(buffer, 10, 10 + len(text), chunk_chars)
    steps = 0
    while decoding.step():
        steps += 1
        assert steps <= len(text) // chunk_chars + 3  # bounded: one step per chunk
    return bytes(buffer)


def b64decode_of_json(text: bytes) -> bytes:
    """What the door accepted before: json.loads' string, then base64.b64decode(validate=True)."""
    value = json.loads(b'"' + text + b'"')
    return base64.b64decode(value, validate=True)


base64_texts = st.one_of(
    st.binary(max_size=64).map(base64.b64encode),  # valid
    st.text(alphabet="ABCxyz019+/=", max_size=40).map(str.encode),  # padding anywhere, lengths off by one
    st.binary(max_size=48).map(lambda b: base64.b64encode(b).replace(b"/", b"\\/")),  # escaped slashes (valid)
    st.lists(st.sampled_from([b"QUJD", b"QUI", b"QQ", b"Q", b"\\/", b"=", b"==", b"===", b"\\u0041", b"\\\\", b" ",
                              b"\\n", b"\xc3\xa9", b"-"]), max_size=12).map(b"".join),
)


@settings(max_examples=400, deadline=None)
@given(text=base64_texts, chunk_chars=st.sampled_from([4, 8, 12, 16, 1024]))
def test_decoding_in_place_accepts_what_b64decode_does_and_gives_the_same_bytes(text, chunk_chars):
    try:
        expected = b64decode_of_json(text)
    except (ValueError, binascii.Error):
        expected = None  # refused: not JSON, not base64
    has_other_escape = b"\\" in text.replace(b"\\/", b"")
    try:
        got = decoded(text, chunk_chars)
    except NotBase64:
        got = None
    if has_other_escape:
        assert got is None  # the one escape read is \/ (the module says why)
    else:
        assert got == expected


def test_a_chunk_never_splits_an_escape_and_padding_only_ends_the_text():
    data = bytes(range(256)) * 4
    text = base64.b64encode(data).replace(b"/", b"\\/")
    for chunk_chars in (4, 8, 12, 16, 20):
        assert decoded(text, chunk_chars) == data
    with pytest.raises(NotBase64, match="padding before its end"):
        decoded(b"QQ==QUJD", 4)
    # binascii's strict mode, as b64decode(validate=True): any run of padding after a whole group, exactly the
    # padding a short group needs
    assert decoded(b"QUJD=====", 4) == decoded(b"QUJD", 4) == b"ABC" and decoded(b"QUI=", 4) == b"AB"
    for wrong in (b"QUI==", b"QQ=", b"QQ===", b"=", b"QUJD\\/=", b"Q"):
        with pytest.raises(NotBase64):
            decoded(wrong, 4)
    with pytest.raises(NotBase64):
        decoded(b"QUJD\\u0041QUI=", 4)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.sampled_from(["data", "id", "a\"b", "é", "\\", "detect"]), inner,
                                           max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(members=st.dictionaries(st.sampled_from(["id", "detector_name", "detect", "regions", "é", "da\"ta", "x"]),
                               json_values, max_size=5),
       data=st.one_of(st.none(), st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()), json_values),
       indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_locate_finds_what_json_reads_at_the_top_level_only(members, data, indent, ascii_only):
    request = dict(members)
    if data is not None:
        request["data"] = data
    body = bytearray(json.dumps(request, indent=indent, ensure_ascii=ascii_only).encode())
    found = locate(body)
    if isinstance(data, str):
        assert json.loads(b'"' + bytes(body[found.start:found.end]) + b'"') == data
        assert json.loads(found.rest) == {**request, "data": ""}
    else:  # no `data` string: nothing cut, the model says what is wrong with the rest
        assert (found.start, found.end) == (-1, -1) and json.loads(found.rest) == request


@pytest.mark.parametrize("body, error, words", [
    (b'["data"]', RequestError, "not a JSON object"),
    (b'{"data": "QUJD", "data": "QUJD"}', RequestError, "'data' given twice"),
    (b'{"data": "QUJD"} {}', RequestError, "more after the object"),
    (b'{"id": "x" "data": "QUJD"}', RequestError, "',' or '}' expected"),
    (b'{"id": "unterminated}', RequestError, "a string without its end"),
    (b'{"data": "QUJD\\"}', RequestError, "a JSON escape other than"),  # a quote escaped in base64
    (b'{"a": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", RequestError, "nested deeper than"),
    (b'{"id": "' + b"x" * REST_BYTES + b'", "data": "QUJD"}', BodyTooLarge, "beside its image"),
    (b'{"a": [' + b"1," * REST_BYTES + b'1], "data": "QUJD"}', BodyTooLarge, "beside its image"),
    (b'{' + b" " * (REST_BYTES + 1) + b'"data": "QUJD"}', BodyTooLarge, "beside its image"),
])
def test_locate_refuses_what_is_not_doods_request_saying_why(body, error, words):
    with pytest.raises(error, match=words):
        locate(bytearray(body))


def test_the_image_text_does_not_count_against_the_rest():
    text = base64.b64encode(bytes(4 * REST_BYTES))
    body = bytearray(b'{"id": "' + b"x" * (REST_BYTES - 64) + b'", "data": "' + text + b'"}')
    found = locate(body)
    assert found.end - found.start == len(text) and len(found.rest) < REST_BYTES
