"""Tasks by name (model.json's `task`): what a model's outputs mean and how they become an answer.

Every module of this package that holds a `TASK` (an app.tasks.base.Task) is registered at import:
`classify` for classification, `detect` for detection. A task is its module (tensors -> its result, roles,
options, named outputs) and its answer's schema; its routes are front doors (app/api/), which import it, never
the reverse. Engines, pools, the registry and the core name none. `register(task)` adds one from outside before
the app is created (a test's throwaway task).
"""

from __future__ import annotations

import importlib
import pkgutil

from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task
from app.tasks.results import Answer

TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Make a task available under its name (replacing one of the same name)."""
    TASKS[task.name] = task
    return task


def unregister(name: str) -> None:
    TASKS.pop(name, None)


for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "results"):
        _task = getattr(importlib.import_module(f"{__name__}.{_module.name}"), "TASK", None)
        if _task is not None:
            register(_task)

__all__ = ["TASKS", "Answer", "NamedOutput", "OutputRoles", "Outputs", "Task", "register", "unregister"]
