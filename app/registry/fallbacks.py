"""Which backend serves a model instead of the one configured, and why: the fallbacks in force.

A fallback is decided by a backend's plug-in (app.engines.Fallback): at start, by its check of the environment
(no TPU, no file this backend runs); at load, by its policy when its interpreters fail (EDGETPU_SERVE_EDGETPU_
ON_FAILURE; by default the model is left degraded on that backend and served on the others); while serving, when
every device of the backend left. The table keeps them per model and requested backend, as clients see them: one
line, file names relative to the model directory. A version carries the fallbacks it was built with
(ModelVersion.fallbacks); the table is what the next load starts from, and what the registry answers with
before a model has a version (a model that failed) or about every model at once (the default backend).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from app.engines import Backend, Fallback
from app.errors import ServeError
from app.model_dir.reading import ModelDir
from app.registry.status import one_line, public_text


def public_fallback(key: str, fallback: Fallback, plugins: Mapping[str, Backend], root: Path) -> Fallback:
    """Backend `key`'s plug-in's decision as clients see it: one line, file names relative to the model directory
    `root`; ServeError for a fallback onto a backend that is not available."""
    if fallback.backend is not None and fallback.backend not in plugins:
        raise ServeError(f"backend {key!r} falls back to {fallback.backend!r}, which is not available")
    return Fallback(fallback.backend, one_line(public_text(fallback.reason, root)))


class Fallbacks:
    """Model -> requested backend -> the Fallback in force."""

    def __init__(self, plugins: Mapping[str, Backend], root: Path):
        self.plugins = plugins
        self.root = root  # the model directory (settings): clients' file names are relative to it
        self._table: dict[str, dict[str, Fallback]] = {}

    def public(self, key: str, fallback: Fallback) -> Fallback:
        return public_fallback(key, fallback, self.plugins, self.root)

    def record(self, name: str, key: str, fallback: Fallback) -> Fallback:
        """`key` does not serve model `name`: `fallback` instead (a plug-in's decision); as recorded."""
        recorded = self._table.setdefault(name, {})[key] = self.public(key, fallback)
        return recorded

    def of(self, name: str) -> dict[str, Fallback]:
        """The model's fallbacks in force, by requested backend (a copy)."""
        return dict(self._table.get(name, {}))

    def get(self, name: str, key: str) -> Fallback | None:
        return self._table.get(name, {}).get(key)

    def keep(self, name: str, fallbacks: Mapping[str, Fallback]) -> None:
        """A version of the model was swapped in: its fallbacks are the ones in force."""
        self._table[name] = dict(fallbacks)

    def rechecked(self, name: str, model_dir: ModelDir) -> dict[str, Fallback]:
        """The model's fallbacks that still hold, each plug-in asked again (Backend.recheck, with the model
        directory as read now): a reload tries again the backends whose plug-in can serve the model now (the
        file it lacked is there, a failure it had may be fixed); the others keep their fallback backend, with
        the reason that holds now."""
        held = {}
        for key, fallback in self.of(name).items():
            still = self.plugins[key].recheck(model_dir)
            if still is not None:
                held[key] = self.public(key, Fallback(fallback.backend, still.reason))
        return held

    def serving_instead(self, key: str, names: Iterable[str]) -> str:
        """The backend serving every one of `names` instead of `key`, when it is the same one for all; else `key`."""
        names = list(names)
        instead = {self.get(name, key) for name in names}
        if names and None not in instead:
            backends = {f.backend for f in instead}
            if len(backends) == 1 and None not in backends:  # None: served by none instead
                return backends.pop()
        return key

    def backends(self) -> set[str]:
        """The backends serving some model instead of another."""
        return {f.backend for per_model in self._table.values() for f in per_model.values() if f.backend}
