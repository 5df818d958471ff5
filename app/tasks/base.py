"""What every task offers: the output roles it reads, checked and resolved at load; its options; its reading of
one run's outputs (its result, one type); and the same outputs as named tensors for protocols that send tensors
(OIP v2).

A task turns a run's output tensors into an answer, as pycoral's adapters do beside a task-neutral run: engines,
pools and pipelines move every output tensor and know no task, and a task knows no ticket, pool, request or front
door (it sits below the registry, which binds it at load, as a backend does; the core, app/core/, calls it).
model.json names the task and, by role, the output tensors it reads (`outputs`: role -> tensor name in the model
file). At load the registry has the task `bind` a pool's output specs: each role resolved to its tensor BY NAME
(never by position), once per loaded version, with the task's named outputs for tensor protocols. A request's run
then reaches the task as `Outputs` (the tensors, their roles, the model directory, the input's geometry), and
`Task.read(outputs, options)` gives the task's result; the core wraps it in an `Answer` with the model, the
backend and the timings. Front doors import tasks, never the reverse: a task names no route.

One type per result. A task's result is one frozen dataclass (`Task.result`), written once: its fields, with their
descriptions (`Annotated[..., Field(description=...)]`), are what every door reads and what the native JSON sends;
a field marked `Internal` stays with the result (segmentation's class map, for its PNG) and is never sent. The
envelope, `Answer[R]`, is one for all tasks: the model, the backend, the timings, the warm-up, cold. On the wire the
result's fields stand where `result` is (one flat object, `Answer.json`, orjson straight from the dataclasses), and
its schema is made from the same two types (`answer_schema`, pydantic's TypeAdapter), so the JSON a route sends and
the schema it documents cannot drift apart (tests/test_tasks.py holds every task's to it). A task's options are
one frozen dataclass too: its fields (but Internal ones) are its native routes' query parameters, with their
constraints and descriptions.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, TypeVar

import numpy as np
import orjson
from pydantic import Field, PlainSerializer, PlainValidator, TypeAdapter, WithJsonSchema
from pydantic.fields import FieldInfo
from typing_extensions import NotRequired, TypedDict

from app.engines import TensorSpec
from app.errors import ModelDirError
from app.imaging.geometry import Geometry

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

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


@dataclass(frozen=True)
class NamedOutput:
    """One tensor of a task's answer, as a tensor protocol names it; shape per input (no batch dimension)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    scale: float | None = None      # a quantized tensor as the model gave it: its quantization
    zero_point: int | None = None


@dataclass(frozen=True)
class OutputRoles:
    """A task's roles resolved against one pool's output tensors: role -> its place among a run's
    outputs, and its tensor's spec (name, shape, dtype, quantization); with the task's named outputs
    on these tensors (Task.named_outputs), made once with them."""

    index: Mapping[str, int]
    specs: Mapping[str, TensorSpec]
    named: tuple[NamedOutput, ...] = ()

    def of(self, outputs: Sequence[np.ndarray], role: str) -> np.ndarray:
        return outputs[self.index[role]]


@dataclass(frozen=True)
class Outputs:
    """One input's run as a task reads it: every output tensor of the model, the task's roles on them, the model
    directory (labels, model.json), and where the model's input came from in the original (`geometry`: normalized
    input coordinates -> the original's pixels; the identity at the input's size for a raw tensor)."""

    tensors: Sequence[np.ndarray]
    roles: OutputRoles
    model_dir: ModelDir
    geometry: Geometry

    def of(self, role: str) -> np.ndarray:
        return self.tensors[self.roles.index[role]]

    def spec(self, role: str) -> TensorSpec:
        return self.roles.specs[role]


@dataclass(frozen=True)
class NoOptions:
    """A task, or a tensor protocol, that takes no options."""


class Task:
    """A task: subclasses set `name` (model.json's `task`), `verb` and `summary` (its native routes: /v1/VERB and
    /v1/models/{name}/VERB, "Classify an image"), `roles`, `options` (the dataclass of what a request may ask of it,
    its routes' query parameters), `result` (the dataclass `read` returns) and, for forms other than JSON, `renders`
    (segmentation's PNG); and implement `read`."""

    name: ClassVar[str]
    verb: ClassVar[str]
    summary: ClassVar[str]
    # the output tensors it reads, by role (model.json `outputs` names each one's tensor)
    roles: ClassVar[tuple[str, ...]]
    options: ClassVar[type] = NoOptions
    result: ClassVar[type]
    renders: ClassVar[Mapping[str, Render]] = {}

    def bind(self, model_dir: ModelDir, outputs: Sequence[TensorSpec]) -> OutputRoles:
        """At load: resolve the roles against the model's output tensors and check them (ModelDirError)."""
        roles = resolve_roles(self, model_dir, outputs)
        self.check(model_dir, roles)
        return dataclasses.replace(roles, named=tuple(self.named_outputs(roles)))

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        """What the task needs of its tensors beyond their presence (shapes, types): ModelDirError."""

    def ready(self, options: Any, model_dir: ModelDir) -> Any:
        """A request's options checked against the model it goes to, before any work on its input (a
        RequestError for what the model cannot do); what `read` gets. By default as they are."""
        return options

    def read(self, outputs: Outputs, options: Any) -> Any:
        """One run's outputs -> the task's result."""
        raise NotImplementedError

    # -- as named tensors (OIP v2's outputs) ----------------------------------------------------

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        """The tensors of its answer, by name; by default each role's tensor as the model gave it."""
        return [NamedOutput(role, spec.dtype, per_input(spec.shape), spec.scale, spec.zero_point)
                for role, spec in roles.specs.items()]

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        """One input's values of named_outputs(), by name: by default each role's tensor as the model gave it, shaped
        as bind() made its named outputs (`OutputRoles.named`, once at load, not per request)."""
        roles, tensors = outputs.roles, outputs.tensors
        index = roles.index
        if roles.named:
            return {named.name: tensors[index[named.name]].reshape(named.shape) for named in roles.named}
        specs = roles.specs  # roles made without bind()
        return {role: tensors[i].reshape(per_input(specs[role].shape)) for role, i in index.items()}


def per_input(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape without its batch dimension of 1 (a tensor of rank 1 keeps its one dimension)."""
    return tuple(shape[1:]) if len(shape) > 1 and shape[0] == 1 else tuple(shape)


def resolve_roles(task: Task, model_dir: ModelDir, outputs: Sequence[TensorSpec]) -> OutputRoles:
    """Each of the task's roles -> the output tensor model.json names for it, found by name. Without a
    name: the one output of a one-output model for a one-role task, else a ModelDirError saying what to name."""
    name = model_dir.name
    declared = model_dir.manifest.outputs
    tensors = [spec.name for spec in outputs]
    unknown = sorted(set(declared) - set(task.roles))
    if unknown:
        raise ModelDirError(f"model {name!r}: model.json `outputs` names {unknown}, roles the {task.name} task "
                            f"does not read; its roles: {list(task.roles)}")
    index = {}
    for role in task.roles:
        tensor = declared.get(role)
        if tensor is None:
            if len(task.roles) == 1 and len(outputs) == 1:
                index[role] = 0
                continue
            raise ModelDirError(
                f"model {name!r} ({task.name}) has {len(outputs)} output tensors {tensors}: model.json must name "
                f"its {role!r} output in `outputs` (role -> tensor name), e.g. \"outputs\": "
                f"{{\"{role}\": \"{tensors[0] if tensors else 'NAME'}\"}}")
        found = [i for i, candidate in enumerate(tensors) if candidate == tensor]
        if len(found) != 1:
            raise ModelDirError(f"model {name!r}: model.json outputs.{role} names tensor {tensor!r}; the model's "
                                f"output tensors are {tensors}" + (" (that name twice)" if found else ""))
        index[role] = found[0]
    return OutputRoles(index, {role: outputs[i] for role, i in index.items()})
