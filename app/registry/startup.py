"""What start-up settles, once, before any interpreter loads: the plug-ins, the models served, each task's default.

`make_plugins` makes every available backend plug-in with its own settings read (a wrong value stops the start,
naming its variable). `find_models` reads the model directories the settings name (every one found by default)
and checks each names itself. `choose_defaults` settles the model each task's routes use when a request names
none (app/settings.py default_model_for: the setting, else the committed model, else the only one of the task),
kept in the registry from then on (`Registry.default_model`): the settings are never written back. A ServeError
from any of them stops the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pydantic import ValidationError

from app.engines import Backend
from app.errors import ModelDirError, ServeError
from app.model_dir.reading import ModelDir, discover, read_model_dir
from app.settings import DEFAULTS, Settings, default_model_for


def make_plugins(settings: Settings, available: Mapping[str, type[Backend]]) -> dict[str, Backend]:
    """Every available plug-in (/v1/devices reports on backends that are not configured too), by key."""
    for key in settings.backends:
        if key not in available:
            raise ServeError(f"unknown backend {key!r} in settings; available: {sorted(available)}")
    unknown = sorted(set(settings.plugins) - set(available))
    if unknown:
        raise ServeError(f"settings for unknown backends {unknown}; available: {sorted(available)}")
    return {key: _make_plugin(cls, settings) for key, cls in available.items()}


def _make_plugin(cls: type[Backend], settings: Settings) -> Backend:
    """The plug-in, with its own settings read: a wrong value stops the start, naming its variable."""
    try:
        return cls(settings)
    except ValidationError as e:
        prefix = cls.settings_class.model_config.get("env_prefix", "") if cls.settings_class else ""
        problems = "; ".join(f"{prefix}{str(error['loc'][0]).upper() if error['loc'] else ''}: {error['msg']} "
                             f"(got {error.get('input')!r})" for error in e.errors())
        raise ServeError(f"settings of backend {cls.key!r}: {problems}") from None


def find_models(settings: Settings) -> dict[str, tuple[Path, ModelDir]]:
    """The model directories to serve, by name, in order (MODELS, else every one found), read and checked."""
    found = discover(settings.model_dir)
    wanted = settings.models or sorted(found)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise ModelDirError(f"models {missing} not found in {settings.model_dir}; found {sorted(found)}")
    if not wanted:
        raise ModelDirError(f"no model directories (with model.json) in {settings.model_dir}")
    models = {}
    for name in wanted:
        model_dir = read_model_dir(found[name])
        if model_dir.name != name:
            raise ModelDirError(f"{found[name]}: model.json names {model_dir.name!r}, the directory {name!r}")
        models[name] = (found[name], model_dir)
    return models


@dataclass(frozen=True)
class Defaults:
    """The model each task's routes use when a request names none, by model.json's task name; settled at start."""

    by_task: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, task: str) -> str | None:
        """The default model of `task`; None where it has none (no model of the task served, or several of a
        task without a default setting: a request then names its model)."""
        return self.by_task.get(task)


def choose_defaults(settings: Settings, tasks: Mapping[str, str]) -> Defaults:
    """Each task's default among the models served (`tasks`: model name -> its task, in served order): a task
    with a setting (app/settings.py DEFAULTS) as that setting says (ServeError, saying what to set, where it
    cannot apply); any other task, its only model served."""
    served = list(tasks)
    by_task: dict[str, list[str]] = {}
    for name, task in tasks.items():
        by_task.setdefault(task, []).append(name)
    chosen = {task: names[0] for task, names in by_task.items() if len(names) == 1}
    for default in DEFAULTS:
        # a model of a task with its own default setting is no default of this one (a detector for /v1/classify)
        others = [name for name in served if tasks[name] != default.task and tasks[name] in _SETTLED]
        try:
            model = default_model_for(getattr(settings, default.setting), served, by_task.get(default.task, []),
                                      default, others)
        except ValueError as e:
            raise ServeError(str(e)) from None
        chosen.pop(default.task, None)
        if model is not None:
            chosen[default.task] = model
    return Defaults(MappingProxyType(chosen))


_SETTLED = {default.task for default in DEFAULTS}  # the tasks whose default a setting names
