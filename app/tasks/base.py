"""What every task offers: the output roles it reads, checked and resolved at load, and its answer
as named tensors for protocols that send tensors (OIP v2).

A task turns a run's output tensors into an answer, as pycoral's adapters do beside a task-neutral
run: engines, pools and pipelines move every output tensor and know no task, and a task knows no
lease, pool or request (it sits below the registry, which binds it at load, as a backend does).
model.json names the task and, by role, the output tensors it reads (`outputs`: role -> tensor name
in the model file). At load the registry has the task `bind` a pool's output specs: each role resolved
to its tensor BY NAME (never by position), once per loaded version, with the task's named outputs for
tensor protocols; requests then read `roles.of(outputs, role)` and `roles.named` (their lease hands
them the roles: `Lease.roles_for(task)`, app/registry/versions.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from app.engines import TensorSpec
from app.errors import ModelDirError

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What a task's answer to one image carries beside its result: the model and the backend that ran it, the
    input's stage timings, the pool's warm-up, and whether the input paid its interpreter's first inference."""

    model: str
    backend: str
    timing_ms: dict[str, float]
    warmup: dict[str, float | None]
    cold: bool


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


class Task:
    """A task: subclasses set `name` (model.json's `task`), `roles` and `routes`, and add the functions
    that read their roles' tensors into an answer (app/tasks/classify.py `scores`, `top_predictions`),
    which their routes call on a run's outputs (app/api/classify.py `classify`)."""

    name: ClassVar[str]
    # the output tensors it reads, by role (model.json `outputs` names each one's tensor)
    roles: ClassVar[tuple[str, ...]]
    # "module:attribute" of each APIRouter holding its inference routes (app/api/routes.py
    # inference_route), one per front door; the app includes them (app/main.py), so adding a task
    # touches no list there
    routes: ClassVar[tuple[str, ...]] = ()

    def bind(self, model_dir: ModelDir, outputs: Sequence[TensorSpec]) -> OutputRoles:
        """At load: resolve the roles against the model's output tensors and check them (ModelDirError)."""
        roles = resolve_roles(self, model_dir, outputs)
        self.check(model_dir, roles)
        return dataclasses.replace(roles, named=tuple(self.named_outputs(roles)))

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        """What the task needs of its tensors beyond their presence (shapes, types): ModelDirError."""

    # -- as named tensors (OIP v2's outputs) ----------------------------------------------------

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        """The tensors of its answer, by name; by default each role's tensor as the model gave it."""
        return [NamedOutput(role, spec.dtype, per_input(spec.shape), spec.scale, spec.zero_point)
                for role, spec in roles.specs.items()]

    def named_values(self, roles: OutputRoles, outputs: Sequence[np.ndarray], model_dir: ModelDir) -> dict[str, np.ndarray]:
        """One input's values of named_outputs(), by name."""
        return {role: outputs[i].reshape(per_input(roles.specs[role].shape)) for role, i in roles.index.items()}


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
