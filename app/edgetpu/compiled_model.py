"""What a model compiled by edgetpu_compiler needs: how many Edge TPU ops, which runtime.

The compiler replaces the part of the graph it maps with `edgetpu-custom-op` nodes. Each
node's custom options are a FlexBuffer map whose key "4" holds a DarwiNN package
(a flatbuffer, identifier "DWN1") that starts with `min_runtime_version`: libedgetpu
refuses a package newer than itself, but only once an interpreter prepares the model
on a device. Reading it here lets the service refuse at start, naming both versions.
Only the flatbuffer fields used are read (TFLite schema.fbs, libedgetpu executable.fbs).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from flatbuffers import flexbuffers

from app.errors import ModelDirError

EDGETPU_CUSTOM_OP = "edgetpu-custom-op"
TFLITE_IDENTIFIER = b"TFL3"
PACKAGE_IDENTIFIER = b"DWN1"
PACKAGE_KEY = "4"  # libedgetpu custom_op_data.cc: "4" -> serialized executable package

# Field slots (declaration order in the schemas).
MODEL_OPERATOR_CODES, MODEL_SUBGRAPHS = 1, 2
OPERATOR_CODE_CUSTOM_CODE = 1
SUBGRAPH_OPERATORS = 3
OPERATOR_OPCODE_INDEX, OPERATOR_CUSTOM_OPTIONS = 0, 5
OPERATOR_LARGE_CUSTOM_OPTIONS_OFFSET, OPERATOR_LARGE_CUSTOM_OPTIONS_SIZE = 9, 10
PACKAGE_MIN_RUNTIME_VERSION, PACKAGE_COMPILER_VERSION = 0, 4


@dataclass(frozen=True)
class CompiledModel:
    edgetpu_ops: int                   # edgetpu-custom-op nodes (0: not compiled)
    min_runtime_version: int | None    # the highest any of them requires
    compiler_version: str | None


class _Table:
    """A flatbuffer table: read a field by slot, absent fields as None."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        self._vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self._vtable_size = struct.unpack_from("<H", buf, self._vtable)[0]

    def _field(self, slot: int) -> int | None:
        entry = 4 + 2 * slot
        if entry >= self._vtable_size:
            return None
        offset = struct.unpack_from("<H", self.buf, self._vtable + entry)[0]
        return self.pos + offset if offset else None

    def scalar(self, slot: int, fmt: str, default=None):
        at = self._field(slot)
        return default if at is None else struct.unpack_from("<" + fmt, self.buf, at)[0]

    def _indirect(self, slot: int) -> int | None:
        at = self._field(slot)
        return None if at is None else at + struct.unpack_from("<I", self.buf, at)[0]

    def bytes(self, slot: int) -> bytes | None:
        at = self._indirect(slot)
        if at is None:
            return None
        length = struct.unpack_from("<I", self.buf, at)[0]
        return self.buf[at + 4: at + 4 + length]

    def string(self, slot: int) -> str | None:
        raw = self.bytes(slot)
        return None if raw is None else raw.decode("utf-8", "replace")

    def tables(self, slot: int) -> list[_Table]:
        at = self._indirect(slot)
        if at is None:
            return []
        count = struct.unpack_from("<I", self.buf, at)[0]
        items = []
        for i in range(count):
            element = at + 4 + 4 * i
            items.append(_Table(self.buf, element + struct.unpack_from("<I", self.buf, element)[0]))
        return items


def _root(buf: bytes) -> _Table:
    return _Table(buf, struct.unpack_from("<I", buf, 0)[0])


def _package_of(custom_options: bytes) -> tuple[int | None, str | None]:
    """(min_runtime_version, compiler_version) of one edgetpu-custom-op node."""
    try:
        value = flexbuffers.GetRoot(custom_options).AsMap[PACKAGE_KEY]
    except (KeyError, TypeError, ValueError, IndexError, struct.error):
        return None, None
    package = bytes(value.AsStringBytes if value.IsString else value.AsBlob)
    if len(package) < 8 or package[4:8] != PACKAGE_IDENTIFIER:
        return None, None
    table = _root(package)
    return table.scalar(PACKAGE_MIN_RUNTIME_VERSION, "i", 0), table.string(PACKAGE_COMPILER_VERSION)


def read_compiled_model(path: Path) -> CompiledModel:
    """Count the Edge TPU nodes of a .tflite file and the runtime version they need."""
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] != TFLITE_IDENTIFIER:
        raise ModelDirError(f"{path} is not a TFLite model (no {TFLITE_IDENTIFIER.decode()} identifier)")
    try:
        model = _root(buf)
        edgetpu_codes = {i for i, code in enumerate(model.tables(MODEL_OPERATOR_CODES))
                         if code.string(OPERATOR_CODE_CUSTOM_CODE) == EDGETPU_CUSTOM_OP}
        count, required, compiler = 0, None, None
        for subgraph in model.tables(MODEL_SUBGRAPHS):
            for op in subgraph.tables(SUBGRAPH_OPERATORS):
                if op.scalar(OPERATOR_OPCODE_INDEX, "I", 0) not in edgetpu_codes:
                    continue
                count += 1
                options = op.bytes(OPERATOR_CUSTOM_OPTIONS)
                if options is None:  # models over 2 GB keep custom options after the flatbuffer
                    start = op.scalar(OPERATOR_LARGE_CUSTOM_OPTIONS_OFFSET, "Q", 0)
                    options = buf[start: start + op.scalar(OPERATOR_LARGE_CUSTOM_OPTIONS_SIZE, "Q", 0)]
                version, by = _package_of(options)
                if version is not None and (required is None or version > required):
                    required, compiler = version, by
    except (struct.error, IndexError) as e:
        raise ModelDirError(f"{path} is not a readable TFLite flatbuffer: {e}") from None
    return CompiledModel(count, required, compiler)
