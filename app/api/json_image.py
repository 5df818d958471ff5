"""The base64 image of a JSON request body (DOODS' `data`), found and decoded where the body arrived.

A DOODS request is a JSON object whose `data` member is the image in base64 (4/3 of the image); the rest of
the request (id, detector, thresholds, regions) is a few hundred bytes. Parsed whole, the body was held three
times over at once: the body, the parser's string of it, the decoded image (26 MB of base64: 72 MB). Here
the body is the only copy:

  locate(body)    the top-level `data` string, found by a scan of the object's top level that skips every
                  other value without recursion (a string to its closing quote, an object or array by its
                  depth, at most MAX_DEPTH deep) and without looking inside `data` but for its closing quote;
                  the rest of the request (the body without that string, at most REST_BYTES) is what the door
                  validates with its own model
  Base64InPlace   that string decoded CHUNK_CHARS of text at a time into the start of the same buffer, which is
                  then cut to the image: one chunk beside the body at most (SCRATCH_BYTES with the rest), and
                  the event loop is handed back between chunks

What is accepted is what base64.b64decode(validate=True) accepts of the string's value as JSON reads it, with
one exception said here: of JSON's escapes, `\\/` (which some encoders write for every slash) is read, and any
other is refused. None but \\uXXXX could stand for a base64 character, and no encoder writes those.
"""

from __future__ import annotations

import binascii
import json
import re
from dataclasses import dataclass

from app.errors import BodyTooLarge, RequestError
from app.memory import release_pages

# Fixed, not settings: what DOODS' requests need, with room (its schema is three levels deep, its members a few
# hundred bytes; its image is bounded by MAX_BODY_BYTES).
REST_BYTES = 64 * 1024  # the request beside its image
MAX_DEPTH = 32
CHUNK_CHARS = 256 * 1024  # base64 text decoded per step: under 1 ms of the event loop here (a multiple of 4)
# What decoding holds beside the body: a chunk of text twice (copied, then its escapes read, where it has any), its
# decoded bytes, and the rest of the request
SCRATCH_BYTES = 2 * CHUNK_CHARS + CHUNK_CHARS * 3 // 4 + REST_BYTES

_SPACE = re.compile(rb"[ \t\n\r]*")
_NESTED = re.compile(rb'["\[\]{}]')  # inside an object or array: the next string or bracket
_SCALAR = re.compile(rb"[^,\]}\s]+")  # a number, true, false or null (the door's model checks which)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


class NotBase64(ValueError):
    """The image's text is not base64 (what b64decode(validate=True) refuses, or a JSON escape other than \\/)."""


@dataclass(frozen=True)
class Located:
    """Where the body's `data` string is: its text at body[start:end] (start == end == -1: no `data` string), and
    the request without it (`"data": ""` in its place)."""

    start: int
    end: int
    rest: bytes


def locate(body: bytearray, key: str = "data") -> Located:
    """The top-level member `key` of the JSON object `body`, where it is a string. RequestError where the body is
    not a JSON object (as far as its top level shows: the rest is the model's to check), where `key` is given
    twice; BodyTooLarge where the request beside that string is over REST_BYTES."""
    scan = _Scan(body)
    pos = scan.space(0)
    if pos >= len(body) or body[pos] != ord("{"):
        raise scan.invalid(pos, "not a JSON object")
    pos = scan.space(pos + 1)
    start = end = -1
    if pos < len(body) and body[pos] == ord("}"):
        pos += 1
    else:
        while True:
            if pos >= len(body) or body[pos] != _QUOTE:
                raise scan.invalid(pos, "a member's name expected")
            name_end = scan.string_end(pos)
            name = scan.name(pos, name_end)
            pos = scan.space(name_end + 1)
            if pos >= len(body) or body[pos] != ord(":"):
                raise scan.invalid(pos, "':' expected")
            pos = scan.space(pos + 1)
            if name == key and pos < len(body) and body[pos] == _QUOTE:
                if start >= 0:
                    raise RequestError(f"not DOODS' detect request: '{key}' given twice")
                start, end = pos + 1, scan.data_end(pos)
                scan.skipped = end - start
                pos = end + 1
            else:
                pos = scan.value_end(pos)
            pos = scan.space(pos)
            if pos < len(body) and body[pos] == ord(","):
                pos = scan.space(pos + 1)
                continue
            if pos < len(body) and body[pos] == ord("}"):
                pos += 1
                break
            raise scan.invalid(pos, "',' or '}' expected")
    if scan.space(pos) != len(body):
        raise scan.invalid(pos, "more after the object")
    rest = bytes(body) if start < 0 else bytes(body[:start]) + bytes(body[end:])
    return Located(start, end, rest)


class _Scan:
    """The top-level scan's position-keeping: the request beside the image bounded as it is read."""

    def __init__(self, body: bytearray):
        self.body = body
        self.skipped = 0  # the length of the image's text, which does not count against REST_BYTES

    def limit(self) -> int:
        """How far the scan may reach: REST_BYTES of the request beside the image, and the image's text."""
        return min(len(self.body), REST_BYTES + self.skipped)

    def space(self, pos: int) -> int:
        return self.within(_SPACE.match(self.body, pos, self.limit()).end())

    def within(self, end: int) -> int:
        """`end`, where the request's bound did not stop the scan that reached it."""
        if end >= self.limit() and end < len(self.body):
            self.beyond(end + 1)
        return end

    def beyond(self, pos: int) -> None:
        if pos - self.skipped > REST_BYTES:
            raise BodyTooLarge(f"DOODS' detect request beside its image is over {REST_BYTES} bytes")

    def invalid(self, pos: int, what: str) -> RequestError:
        return RequestError(f"not DOODS' detect request: not JSON at byte {pos}: {what}")

    def string_end(self, pos: int) -> int:
        """The closing quote of the string opening at `pos` (within the request's bound)."""
        limit, quote = self.limit(), pos
        while True:
            quote = self.body.find(b'"', quote + 1, limit)
            if quote < 0:
                self.beyond(limit + 1)
                raise self.invalid(pos, "a string without its end")
            escapes = 0
            while self.body[quote - 1 - escapes] == _BACKSLASH:  # bounded by the string, within REST_BYTES
                escapes += 1
            if escapes % 2 == 0:
                return quote

    def data_end(self, pos: int) -> int:
        """The closing quote of the image's text opening at `pos`: its first quote, which no backslash may precede
        (in base64, \\" and \\\\ can only be refused: said now, without walking back along the text)."""
        quote = self.body.find(b'"', pos + 1)
        if quote < 0:
            raise self.invalid(pos, "a string without its end")
        if self.body[quote - 1] == _BACKSLASH:
            raise RequestError("data: not base64 (a JSON escape other than \\/ in its text)")
        return quote

    def name(self, pos: int, end: int) -> str:
        raw = bytes(self.body[pos:end + 1])
        try:
            return json.loads(raw) if b"\\" in raw else raw[1:-1].decode()
        except ValueError:
            raise self.invalid(pos, "a member's name that is not a JSON string") from None

    def value_end(self, pos: int) -> int:
        """Past the value at `pos`: a string, an object or array (by its depth, strings skipped), or a scalar."""
        body = self.body
        if pos >= len(body):
            raise self.invalid(pos, "a value expected")
        if body[pos] == _QUOTE:
            return self.string_end(pos) + 1
        if body[pos] not in b"[{":
            scalar = _SCALAR.match(body, pos, self.limit())
            if scalar is None:
                raise self.invalid(pos, "a value expected")
            return self.within(scalar.end())
        depth = 0
        while True:
            found = _NESTED.search(body, pos, self.limit())
            if found is None:
                self.beyond(self.limit() + 1)
                raise self.invalid(pos, "an object or array without its end")
            pos = found.start()
            if body[pos] == _QUOTE:
                pos = self.string_end(pos) + 1
                continue
            depth += 1 if body[pos] in b"[{" else -1
            if depth > MAX_DEPTH:
                raise self.invalid(pos, f"nested deeper than {MAX_DEPTH}")
            pos += 1
            if depth == 0:
                return pos


class Base64InPlace:
    """Decodes buffer[start:end], the text of a JSON string, into buffer[0:n], then cuts the buffer to those n
    bytes: step() by step(), CHUNK_CHARS of text each. Writing never overtakes reading (n <= 3/4 of the text),
    so the text still to decode is never overwritten. NotBase64 where the text is not base64.

    b64decode(validate=True) is binascii's strict mode, which reads the text's last group with the `=` run that
    ends it (and takes any number of them after a whole group): that group is kept back and decoded last,
    with the run (up to three `=`: what the strict mode tells apart)."""

    def __init__(self, buffer: bytearray, start: int, end: int, chunk_chars: int = CHUNK_CHARS):
        if chunk_chars <= 0 or chunk_chars % 4:
            raise ValueError(f"chunk_chars={chunk_chars}: a positive multiple of 4")
        self.buffer = buffer
        self.read = start
        self.text_end = _padding_start(buffer, start, end)
        self.padding = min(end - self.text_end, 3)
        self.written = 0
        self.chunk_chars = chunk_chars
        self._carry = b""  # text read and not decoded yet: a group an escape cut, the last group

    def step(self) -> bool:
        """Decode the next chunk; False once the whole text is decoded and the buffer cut to the image."""
        if self.read >= self.text_end:
            self._decode(self._carry + b"=" * self.padding)
            self._carry = b""
            release_pages(self.buffer, self.written)  # the text's pages past the image, at once
            del self.buffer[self.written:]
            return False
        stop = min(self.read + self.chunk_chars, self.text_end)
        if self.buffer.find(b"=", self.read, stop) >= 0:
            raise NotBase64("padding before its end")
        last = stop >= self.text_end
        if not self._carry and not last and self.buffer.find(b"\\", self.read, stop) < 0:
            with memoryview(self.buffer) as view, view[self.read:stop] as text:
                self._decode(text)  # whole groups, straight from the body
        else:
            if self.buffer[stop - 1] == _BACKSLASH and not last:
                stop += 1  # an escape is never split between two chunks
                last = stop >= self.text_end
            text = self.buffer[self.read:stop].replace(b"\\/", b"/")
            if b"\\" in text:
                raise NotBase64("a JSON escape other than \\/ in its text")
            text[:0] = self._carry
            whole = len(text) - min(len(text), len(text) % 4 or (4 if last else 0))  # less a cut group, or the last
            self._carry = bytes(text[whole:])
            with memoryview(text) as view, view[:whole] as groups:
                self._decode(groups)
        self.read = stop
        return True

    def _decode(self, text: bytes | bytearray | memoryview) -> None:
        try:
            decoded = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error as e:
            raise NotBase64(str(e)) from None
        self.buffer[self.written:self.written + len(decoded)] = decoded  # the same length: in place
        self.written += len(decoded)


def _padding_start(buffer: bytearray, start: int, end: int) -> int:
    """Where the run of `=` that ends buffer[start:end] begins (looked for backwards, twice as far each time)."""
    reach = 8
    while True:
        first = max(start, end - reach)
        kept = len(buffer[first:end].rstrip(b"="))
        if kept or first == start:
            return first + kept
        reach *= 2
