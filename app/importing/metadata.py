"""What a .tflite file says about itself: its TFLite metadata and the files packed with it.

Coral's model zoo, Model Maker and TFLite's metadata writers put two things into a model file:
  - a flatbuffer of schema `metadata_schema.fbs` (identifier "M001") in a model buffer that the
    model's `metadata` entry "TFLITE_METADATA" points at: per input tensor its image properties,
    normalization (`(pixel - mean) / std`) and value range; per output tensor the names of its
    associated files (labels);
  - those associated files, as a zip archive appended to the flatbuffer (`zipfile` reads a zip
    behind other bytes).

Only the fields the importer needs are read, by their slots in the schema (declaration order,
metadata_schema.fbs of tflite-support): no TensorFlow and no tflite-support. The generated reader
of that schema is not shipped by any package the project installs, and the service never reads it.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field

from flatbuffers import encode, number_types
from flatbuffers.table import Table

from app.tflite_file import schema

METADATA_NAME = "TFLITE_METADATA"
IDENTIFIER = b"M001"

# Slots, in the declaration order of metadata_schema.fbs.
MODEL_NAME, MODEL_DESCRIPTION, MODEL_VERSION, MODEL_SUBGRAPHS, MODEL_AUTHOR, MODEL_LICENSE, MODEL_FILES = range(7)
SUBGRAPH_INPUTS, SUBGRAPH_OUTPUTS, SUBGRAPH_FILES = 2, 3, 4
TENSOR_NAME, TENSOR_CONTENT, TENSOR_PROCESS_UNITS, TENSOR_STATS, TENSOR_FILES = 0, 3, 4, 5, 6
CONTENT_PROPERTIES_TYPE, CONTENT_PROPERTIES = 0, 1
IMAGE_COLOR_SPACE, IMAGE_DEFAULT_SIZE = 0, 1
SIZE_WIDTH, SIZE_HEIGHT = 0, 1
PROCESS_UNIT_OPTIONS_TYPE, PROCESS_UNIT_OPTIONS = 0, 1
NORMALIZATION_MEAN, NORMALIZATION_STD = 0, 1
STATS_MAX, STATS_MIN = 0, 1
FILE_NAME, FILE_DESCRIPTION, FILE_TYPE = 0, 1, 2

# Union members and enum values.
CONTENT_IMAGE = 2            # ContentProperties.ImageProperties
OPTIONS_NORMALIZATION = 1    # ProcessUnitOptions.NormalizationOptions
COLOR_SPACES = {0: "unknown", 1: "RGB", 2: "GRAYSCALE"}
FILE_TYPES = {0: "UNKNOWN", 1: "DESCRIPTIONS", 2: "TENSOR_AXIS_LABELS", 3: "TENSOR_VALUE_LABELS",
              4: "TENSOR_AXIS_SCORE_CALIBRATION", 5: "VOCABULARY", 6: "SCANN_INDEX_FILE"}
LABEL_FILE_TYPES = ("TENSOR_AXIS_LABELS", "TENSOR_VALUE_LABELS")


class MetadataError(Exception):
    """The file's metadata is there but cannot be read."""


@dataclass(frozen=True)
class AssociatedFile:
    name: str
    type: str          # FILE_TYPES
    description: str = ""


@dataclass(frozen=True)
class TensorInfo:
    name: str = ""
    color_space: str | None = None            # image inputs: RGB, GRAYSCALE, unknown
    default_size: tuple[int, int] | None = None  # (width, height)
    mean: tuple[float, ...] | None = None     # NormalizationOptions: real = (pixel - mean) / std
    std: tuple[float, ...] | None = None
    stats_min: tuple[float, ...] | None = None
    stats_max: tuple[float, ...] | None = None
    files: tuple[AssociatedFile, ...] = ()


@dataclass(frozen=True)
class Metadata:
    """The fields of a model's TFLite metadata the importer uses; empty where the file has none."""

    name: str = ""
    description: str = ""
    version: str = ""
    author: str = ""
    license: str = ""
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    files: tuple[AssociatedFile, ...] = ()     # model-level associated files
    packed: dict[str, bytes] = field(default_factory=dict, repr=False)  # the appended zip's files by name

    @property
    def present(self) -> bool:
        return bool(self.name or self.inputs or self.outputs or self.files or self.packed)

    def summary(self) -> dict:
        """What model.json records of it."""
        facts = {"name": self.name, "description": self.description, "version": self.version,
                 "author": self.author, "license": self.license}
        facts = {key: value for key, value in facts.items() if value}
        if self.packed:
            facts["packed_files"] = sorted(self.packed)
        return facts

    def label_files(self, output: int | None = None) -> list[AssociatedFile]:
        """Label files of one output tensor (or of every output, then the model's), as listed."""
        tensors = self.outputs if output is None else self.outputs[output:output + 1]
        found = [f for t in tensors for f in t.files if f.type in LABEL_FILE_TYPES]
        if output is None:
            found += [f for f in self.files if f.type in LABEL_FILE_TYPES]
        return found


def read_metadata(buf: bytes) -> Metadata:
    """The metadata of a .tflite file's bytes: the M001 flatbuffer if any, and the appended zip if any."""
    packed = packed_files(buf)
    raw = metadata_buffer(buf)
    if raw is None:
        return Metadata(packed=packed)
    try:
        return _parse(raw, packed)
    except (IndexError, ValueError, UnicodeDecodeError) as e:
        raise MetadataError(f"the file's {METADATA_NAME} entry is not a readable metadata flatbuffer: {e}") from None


def metadata_buffer(buf: bytes) -> bytes | None:
    """The bytes of the buffer named TFLITE_METADATA in the model's `metadata` list, or None."""
    model = schema().Model.GetRootAs(buf, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if (entry.Name() or b"").decode("utf-8", "replace") != METADATA_NAME:
            continue
        buffer = model.Buffers(entry.Buffer())
        if buffer.DataLength():
            return buffer.DataAsNumpy().tobytes()
        if buffer.Size():  # stored after the flatbuffer (files over 2 GB, some writers)
            return bytes(buf[buffer.Offset(): buffer.Offset() + buffer.Size()])
    return None


# The most a packed file may hold, decompressed: labels and Ultralytics' metadata are kilobytes; a file a client
# uploads must not inflate into gigabytes (a zip's declared size bounds what zipfile decompresses).
MAX_PACKED_BYTES = 16 << 20


def packed_files(buf: bytes) -> dict[str, bytes]:
    """The files of the zip appended to the model (empty when there is none), in the archive's order up to
    MAX_PACKED_BYTES decompressed in all; a file past that is left out."""
    found, room = {}, MAX_PACKED_BYTES
    try:
        with zipfile.ZipFile(io.BytesIO(buf)) as archive:
            for info in archive.infolist():
                if info.is_dir() or info.file_size > room:
                    continue
                found[info.filename] = archive.read(info)
                room -= len(found[info.filename])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError, RuntimeError):
        return {}
    return found


# ---- reading the flatbuffer by slot ------------------------------------------------------------

def _root(buf: bytes) -> Table:
    if len(buf) < 8 or buf[4:8] != IDENTIFIER:
        raise ValueError(f"no {IDENTIFIER.decode()} identifier")
    return Table(bytearray(buf), encode.Get(number_types.UOffsetTFlags.packer_type, buf, 0))


def _at(table: Table, slot: int) -> int:
    return table.Offset(4 + 2 * slot)


def _string(table: Table, slot: int) -> str:
    at = _at(table, slot)
    return table.String(at + table.Pos).decode("utf-8", "replace") if at else ""


def _scalar(table: Table, slot: int, flags, default):
    at = _at(table, slot)
    return table.Get(flags, at + table.Pos) if at else default


def _table(table: Table, slot: int) -> Table | None:
    at = _at(table, slot)
    return Table(table.Bytes, table.Indirect(at + table.Pos)) if at else None


def _tables(table: Table, slot: int) -> list[Table]:
    at = _at(table, slot)
    if not at:
        return []
    start, count = table.Vector(at), table.VectorLen(at)
    return [Table(table.Bytes, table.Indirect(start + 4 * i)) for i in range(count)]


def _floats(table: Table, slot: int) -> tuple[float, ...] | None:
    at = _at(table, slot)
    if not at:
        return None
    return tuple(float(v) for v in table.GetVectorAsNumpy(number_types.Float32Flags, at))


def _union(table: Table, type_slot: int, value_slot: int) -> tuple[int, Table | None]:
    kind = _scalar(table, type_slot, number_types.Uint8Flags, 0)
    at = _at(table, value_slot)
    if not kind or not at:
        return 0, None
    value = Table(table.Bytes, 0)
    table.Union(value, at)  # points `value` at the member table
    return kind, value


def _files(table: Table, slot: int) -> tuple[AssociatedFile, ...]:
    return tuple(AssociatedFile(_string(f, FILE_NAME), FILE_TYPES.get(_scalar(f, FILE_TYPE, number_types.Int8Flags, 0),
                                                                      "UNKNOWN"),
                                _string(f, FILE_DESCRIPTION))
                 for f in _tables(table, slot))


def _tensor(table: Table) -> TensorInfo:
    color_space = default_size = None
    content = _table(table, TENSOR_CONTENT)
    if content is not None:
        kind, properties = _union(content, CONTENT_PROPERTIES_TYPE, CONTENT_PROPERTIES)
        if kind == CONTENT_IMAGE and properties is not None:
            color_space = COLOR_SPACES.get(_scalar(properties, IMAGE_COLOR_SPACE, number_types.Int8Flags, 0), "unknown")
            size = _table(properties, IMAGE_DEFAULT_SIZE)
            if size is not None:
                default_size = (_scalar(size, SIZE_WIDTH, number_types.Uint32Flags, 0),
                                _scalar(size, SIZE_HEIGHT, number_types.Uint32Flags, 0))
    mean = std = None
    for unit in _tables(table, TENSOR_PROCESS_UNITS):
        kind, options = _union(unit, PROCESS_UNIT_OPTIONS_TYPE, PROCESS_UNIT_OPTIONS)
        if kind == OPTIONS_NORMALIZATION and options is not None:
            mean, std = _floats(options, NORMALIZATION_MEAN), _floats(options, NORMALIZATION_STD)
    stats = _table(table, TENSOR_STATS)
    return TensorInfo(
        name=_string(table, TENSOR_NAME), color_space=color_space, default_size=default_size, mean=mean, std=std,
        stats_min=_floats(stats, STATS_MIN) if stats is not None else None,
        stats_max=_floats(stats, STATS_MAX) if stats is not None else None,
        files=_files(table, TENSOR_FILES))


def _parse(raw: bytes, packed: dict[str, bytes]) -> Metadata:
    root = _root(raw)
    subgraphs = _tables(root, MODEL_SUBGRAPHS)
    first = subgraphs[0] if subgraphs else None
    return Metadata(
        name=_string(root, MODEL_NAME), description=_string(root, MODEL_DESCRIPTION),
        version=_string(root, MODEL_VERSION), author=_string(root, MODEL_AUTHOR), license=_string(root, MODEL_LICENSE),
        inputs=tuple(_tensor(t) for t in _tables(first, SUBGRAPH_INPUTS)) if first is not None else (),
        outputs=tuple(_tensor(t) for t in _tables(first, SUBGRAPH_OUTPUTS)) if first is not None else (),
        files=_files(root, MODEL_FILES) + (_files(first, SUBGRAPH_FILES) if first is not None else ()),
        packed=packed,
    )
