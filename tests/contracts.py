"""What the service relies on in a library past its documented API, checked by name (tests/test_http_server.py for
uvicorn, tests/test_gunicorn_worker.py for gunicorn and uvicorn-worker): each method with the parameters it is
called or overridden with, so that an upgrade that changes one fails there first, saying which."""

from __future__ import annotations

import inspect


def parameters(function, skip: int = 1) -> str:
    """A function's parameters as `a, b, c=None`, after the first `skip` (a method's self)."""
    shown = []
    for p in list(inspect.signature(function).parameters.values())[skip:]:
        shown.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return ", ".join(shown)


def changed_methods(owner: type, methods: dict[str, str]) -> list[str]:
    """What differs from `methods` ({name: parameters}) in `owner`: each method gone or with other parameters."""
    changed = []
    for name, expected in methods.items():
        method = getattr(owner, name, None)
        if not callable(method):
            changed.append(f"{owner.__name__}.{name} is gone")
        elif parameters(method) != expected:
            changed.append(f"{owner.__name__}.{name}({parameters(method)}), was ({expected})")
    return changed
