"""What every task offers: the output roles it reads, checked and resolved at load; its options; its reading of
one run's outputs (its result, and its answer's schema); and the same outputs as named tensors for protocols that
send tensors (OIP v2).

A task turns a run's output tensors into an answer, as pycoral's adapters do beside a task-neutral run: engines,
pools and pipelines move every output tensor and know no task, and a task knows no ticket, pool, request or front
door (it sits below the registry, which binds it at load, as a backend does; the core, app/core/, calls it).
model.json names the task and, by role, the output tensors it reads (`outputs`: role -> tensor name in the model
file). At load the registry has the task `bind` a pool's output specs: each role resolved to its tensor BY NAME
(never by position), once per loaded version, with the task's named outputs for tensor protocols. A request's run
then reaches the task as `Outputs` (the tensors, their roles, the model directory, the input's geometry), and
`Task.read(outputs, options)` gives the task's result; the core wraps it in an `Answer` with the model, the
backend and the timings. Front doors import tasks, never the reverse: a task names no route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, Field, model_serializer

from app.engines import TensorSpec
from app.errors import ModelDirError
from app.imaging.geometry import Geometry

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class Answer(Generic[R]):
    """A task's answer to one input: its result, the model and the backend that ran it, the input's stage
    timings (ms), the pool's warm-up, and whether the input paid its interpreter's first inference."""

    model: str
    backend: str
    result: R
    timing_ms: dict[str, Any]
    warmup: dict[str, float | None]
    cold: bool

    def field(self, name: str) -> Any:
        """A field of the task's native answer (its schema's): the answer's own, else its result's."""
        return getattr(self, name) if name != "result" and hasattr(self, name) else getattr(self.result, name)


class Timing(BaseModel):
    """An answer's `timing_ms`, part of every task's schema."""

    decode: float = Field(description="bytes to upright RGB image, ms")
    preprocess: float = Field(description="crop, resize, quantize to the input tensor, ms")
    queue: float = Field(description="waiting for a free interpreter (device), hand-off included, ms")
    inference: float = Field(description="the interpreter's invoke, ms")
    postprocess: float = Field(description="the task's work on the outputs (classification: dequantize, softmax, "
                                           "top-k; detection: boxes to the image's pixels, labels), ms")
    total: float = Field(description="from the first byte decoded to the response built, ms")
    segments: list[float] | None = Field(
        default=None, description="a segmented model (a pipeline): each segment's invoke, in order, ms; "
                                  "absent for a whole model")

    @model_serializer(mode="wrap")
    def _segments_only_when_pipelined(self, handler):
        """A whole model's timings stay as they were: no `segments` key rather than a null."""
        data = handler(self)
        if data.get("segments") is None:
            data.pop("segments", None)
        return data


class Warmup(BaseModel):
    """An answer's `warmup`, part of every task's schema."""

    load_ms: float = Field(description="creating and allocating this backend's interpreters")
    first_inference_ms: float | None = Field(description="the first inference after (re)load")


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
    """A task: subclasses set `name` (model.json's `task`), `roles`, `options` (the dataclass of what a request may
    ask of it) and `schema` (its native answer's JSON: the model, the backend, the result's fields, the timings),
    and implement `read`."""

    name: ClassVar[str]
    # the output tensors it reads, by role (model.json `outputs` names each one's tensor)
    roles: ClassVar[tuple[str, ...]]
    options: ClassVar[type] = NoOptions
    schema: ClassVar[type[BaseModel] | None] = None

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

    # -- its native answer, as JSON -------------------------------------------------------------

    def native(self, answer: Answer) -> dict[str, Any]:
        """The answer's fields in its schema's order (the v1 JSON: what a front door serializes)."""
        return {name: answer.field(name) for name in self.schema.model_fields}

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
