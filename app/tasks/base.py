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

One type per result: a task's result is the one dataclass `read` returns, in the one envelope (`Answer`), and its
options one dataclass too, its native routes' query parameters (app/tasks/results.py: the envelope, the JSON and
its schema). A task declares its model.json name, its verb and its summary as class arguments
(`class ClassificationTask(Task, name="classification", verb="classify", summary="Classify an image")`), and
`read`'s annotations name its options and result types: each said once.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from app.engines import TensorSpec
from app.errors import ModelDirError
from app.imaging.geometry import Geometry
from app.tasks.results import Render

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

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
    input coordinates -> the original's pixels; the identity at the input's size for a raw tensor); and how it ran,
    for the answer's timings (the core's: app/core/runs.py)."""

    tensors: Sequence[np.ndarray]
    roles: OutputRoles
    model_dir: ModelDir
    geometry: Geometry
    stages_ms: dict[str, float] = field(default_factory=dict)  # decode and preprocess (an image), queue, inference
    segments_ms: list[float] | None = None  # a pipelined model: each segment's invoke, in order
    cold: bool = False  # the input paid its interpreter's first inference
    started: float = 0.0  # time.perf_counter() when the work on this input began

    def of(self, role: str) -> np.ndarray:
        return self.tensors[self.roles.index[role]]

    def spec(self, role: str) -> TensorSpec:
        return self.roles.specs[role]


@dataclass(frozen=True)
class NoOptions:
    """A task, or a tensor protocol, that takes no options."""


class Task:
    """A task: subclasses name themselves in their class arguments (`name`, model.json's `task`; `verb` and `summary`,
    its native routes: /v1/VERB and /v1/models/{name}/VERB, "Classify an image"), set `roles` and, for forms other
    than JSON, `renders` (segmentation's PNG), and implement `read`, whose annotations name `options` (the dataclass
    of what a request may ask of it, its routes' query parameters; NoOptions when unannotated) and `result` (the
    dataclass it returns)."""

    name: ClassVar[str]
    verb: ClassVar[str]
    summary: ClassVar[str]
    # the output tensors it reads, by role (model.json `outputs` names each one's tensor)
    roles: ClassVar[tuple[str, ...]]
    options: ClassVar[type] = NoOptions
    result: ClassVar[type]
    renders: ClassVar[Mapping[str, Render]] = {}

    def __init_subclass__(cls, *, name: str | None = None, verb: str | None = None, summary: str | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attribute, value in (("name", name), ("verb", verb), ("summary", summary)):
            if value is not None:
                setattr(cls, attribute, value)
        if "read" in cls.__dict__:
            try:
                hints = typing.get_type_hints(cls.read)
            except NameError as e:
                raise TypeError(f"{cls.__name__}.read: its annotations name its options and result types, and "
                                f"must resolve where it is defined: {e}") from None
            if "return" in hints:
                cls.result = hints["return"]
            if "options" in hints:
                cls.options = hints["options"]

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
