"""Backend plug-ins by key. A plug-in whose runtime cannot be imported is left out, never fatal.

`register(plugin)` adds one from outside the product's own list (a benchmark's simulated
accelerator, say) before the app is created; the registry then drives it like any other.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from app.engines.base import Backend, Engine, EngineOptions, Fallback, MemberView, TensorSpec
from app.settings import PluginSettings

log = logging.getLogger(__name__)

# The product's plug-ins: every module of this package that holds a `PLUGIN` (a Backend subclass);
# the others (base, litert) are what plug-ins share.
PRODUCT = tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.name != "base")

BACKENDS: dict[str, type[Backend]] = {}
# key -> its Engine class (loading one interpreter directly, as bench/ scripts do)
ENGINES: dict[str, type[Engine]] = {}


def register(plugin: type[Backend]) -> type[Backend]:
    """Make a backend available under its key (replacing one of the same key)."""
    BACKENDS[plugin.key] = plugin
    ENGINES[plugin.key] = plugin.engine
    return plugin


def unregister(key: str) -> None:
    BACKENDS.pop(key, None)
    ENGINES.pop(key, None)


def load_plugins(modules: tuple[str, ...]) -> dict[str, str]:
    """Import and register each module's PLUGIN; return the modules left out, with why."""
    left_out = {}
    for module in modules:
        try:
            plugin = getattr(importlib.import_module(module), "PLUGIN", None)
            if plugin is not None:
                register(plugin)
        except ImportError as e:  # e.g. no TFLite runtime, no flatbuffers: the other backends still serve
            log.warning("backend %s left out: %s", module.rsplit(".", 1)[-1], e)
            left_out[module] = str(e)
    return left_out


load_plugins(PRODUCT)

__all__ = ["BACKENDS", "ENGINES", "Backend", "Engine", "EngineOptions", "Fallback", "MemberView", "PluginSettings",
           "TensorSpec", "load_plugins", "register", "unregister"]
