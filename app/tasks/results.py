"""What a task answers, said once: its result's type, the one envelope, the native JSON and its schema.

A task's result is one frozen dataclass (what `Task.read` returns), written once: its fields, with their
descriptions (`Annotated[..., Field(description=...)]`), are what every door reads (the native JSON, DeepStack's and
DOODS' shapes, Frigate's rows) and what the native JSON sends; a field marked `Internal` stays with the result
(segmentation's class map, for its PNG) and is never sent. The envelope, `Answer[R]`, is one for all tasks: the
model, the backend, the timings, the warm-up, cold. On the wire the result's fields stand where `result` is (one
flat object: `Answer.json`, orjson straight from the dataclasses), and its schema is made from the same two types
(`answer_schema`, for FastAPI's response_model and pydantic's TypeAdapter), so the JSON a route sends and the schema
it documents cannot drift apart (tests/test_tasks.py holds every task's to it). A task's options are one frozen
dataclass too: its fields (but Internal ones) are its native routes' query parameters, with their constraints and
descriptions; `AtMost` bounds one by a setting. The parts several results share are here: the original image's
size, a class's label and id.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import numpy as np
import orjson
from pydantic import Field, PlainSerializer, PlainValidator, TypeAdapter, WithJsonSchema
from pydantic.fields import FieldInfo
from typing_extensions import NotRequired, TypedDict

R = TypeVar("R")

# A field off the wire: kept with a result for the task's own use and never sent (Annotated[..., Internal]); on
# options, a value a front door sets that no request reads.
Internal = Field(exclude=True)

# A vector of numbers (an embedding) as a result field: a float ndarray, sent as a JSON array of numbers (orjson's
# numpy serialization, each value in its shortest form).
Vector = Annotated[np.ndarray, PlainValidator(np.asarray), PlainSerializer(lambda values: values.tolist()),
                   WithJsonSchema({"type": "array", "items": {"type": "number"}})]


@dataclass(frozen=True)
class AtMost:
    """An option's upper bound that is one of the service's settings (the Settings field named): `top_k` at most
    MAX_TOP_K. The native routes apply it as the parameter's maximum."""

    setting: str


class Timing(TypedDict):
    """An answer's `timing_ms` (ms): each stage of the input's work. A raw tensor has no decode or preprocess."""

    decode: Annotated[float, Field(description="bytes to upright RGB image, ms")]
    preprocess: Annotated[float, Field(description="crop, resize, quantize to the input tensor, ms")]
    queue: Annotated[float, Field(description="waiting for a free interpreter (device), hand-off included, ms")]
    inference: Annotated[float, Field(description="the interpreter's invoke, ms")]
    postprocess: Annotated[float, Field(description="the task's work on the outputs (classification: dequantize, "
                                                    "softmax, top-k; detection: boxes to the image's pixels, "
                                                    "labels), ms")]
    total: Annotated[float, Field(description="from the first byte decoded to the response built, ms")]
    segments: NotRequired[Annotated[list[float], Field(
        description="a segmented model (a pipeline): each segment's invoke, in order, ms; absent for a whole model")]]


class Warmup(TypedDict):
    """An answer's `warmup`: its pool's load and first inference."""

    load_ms: Annotated[float, Field(description="creating and allocating this backend's interpreters")]
    first_inference_ms: Annotated[float | None, Field(description="the first inference after (re)load")]


@dataclass(frozen=True, kw_only=True)
class Answer(Generic[R]):
    """A task's answer to one input: its result, the model and the backend that ran it, the input's stage
    timings (ms), the pool's warm-up, and whether the input paid its interpreter's first inference."""

    model: str
    backend: Annotated[str, Field(description="the backend that actually ran")]
    result: R
    timing_ms: Timing
    warmup: Warmup
    cold: Annotated[bool, Field(description="true when this request paid its interpreter's first inference")]

    def json(self) -> bytes:
        """The native JSON: the envelope with the result's fields in place of `result`, in the schema's order
        (answer_schema), straight from the dataclasses (orjson: ~1 us for a classification, where building and
        dumping a pydantic model took ~12 us; the same bytes as the schema's TypeAdapter dumps)."""
        result = self.result
        body = {"model": self.model, "backend": self.backend}
        for name in wire_fields(type(result)):
            body[name] = getattr(result, name)
        body["timing_ms"] = self.timing_ms
        body["warmup"] = self.warmup
        body["cold"] = self.cold
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _internal(hint: Any) -> bool:
    return typing.get_origin(hint) is Annotated and any(
        isinstance(meta, FieldInfo) and meta.exclude is True for meta in typing.get_args(hint)[1:])


@functools.cache
def wire_fields(result: type) -> tuple[str, ...]:
    """The fields of a result type that go on the wire, in order: every dataclass field but the Internal ones."""
    hints = typing.get_type_hints(result, include_extras=True)
    return tuple(f.name for f in dataclasses.fields(result) if not _internal(hints[f.name]))


@functools.cache
def answer_schema(result: type, name: str) -> type:
    """The native answer of a result type as one flat dataclass named `name`, made from Answer and the result's wire
    fields (in Answer.json's order), for its JSON schema (FastAPI's response_model, a TypeAdapter): never built on
    the request path."""
    envelope = typing.get_type_hints(Answer, include_extras=True)
    fields = typing.get_type_hints(result, include_extras=True)
    flat = [(field, envelope[field]) for field in ("model", "backend")]
    flat += [(field, fields[field]) for field in wire_fields(result)]
    flat += [(field, envelope[field]) for field in ("timing_ms", "warmup", "cold")]
    made = dataclasses.make_dataclass(name, flat, frozen=True)
    made.__doc__ = f"{result.__name__}: {(result.__doc__ or '').strip()}"
    made.__module__ = result.__module__
    return made


@functools.cache
def answer_adapter(result: type, name: str) -> TypeAdapter:
    """The TypeAdapter of answer_schema(result, name): its JSON schema, and the check of an answer's JSON."""
    return TypeAdapter(answer_schema(result, name))


@dataclass(frozen=True)
class Render:
    """Another form of a task's answer than its JSON (segmentation's PNG mask): its media type, what it is, and how
    it is made from the result (`make`, run off the event loop: it may take a while)."""

    media_type: str
    description: str
    make: Callable[[Any], bytes]


# -- what several results share -------------------------------------------------------------------------------

Label = Annotated[str, Field(description="the class's line in labels.txt; a class without a label: its id")]
ClassId = Annotated[int, Field(description="the model's class id (0-based, without background: line class_id of "
                                           "labels.txt)")]


@dataclass(frozen=True)
class ImageSize:
    width: Annotated[int, Field(description="the original image's width, as a viewer shows it")]
    height: int


# The original image's size as a viewer shows it (EXIF orientation applied): what a result's pixels are in
OriginalImage = Annotated[ImageSize, Field(description="the original image, as a viewer shows it: what the answer's "
                                                       "boxes, keypoints or mask are in")]


def label_of(class_id: int, labels: tuple[str, ...]) -> str:
    """Line class_id of labels.txt; an id without a label (a blank line, or past the end) is named by its number."""
    return (labels[class_id] if 0 <= class_id < len(labels) else "") or str(class_id)
