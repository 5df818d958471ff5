"""The OpenAPI description, completed with what only the running process knows: the backends it serves.

`backend` is a plain string to the handlers (an unknown one is refused with a 400 naming the
loaded ones); in the description it is an enum of this process's backends, so a client or a
fuzzer that follows the schema asks only for backends that can answer.
"""

from __future__ import annotations

import copy

from fastapi import FastAPI

from app.registry import Registry

BACKEND_PARAMETER = "backend"
CPU, EDGETPU = "cpu", "edgetpu"


def served_backends(registry: Registry) -> list[str]:
    """The configured backends, in order, with `edgetpu` replaced by `cpu` when every model fell back to it."""
    configured = registry.settings.backends
    all_fell_back = configured[0] == EDGETPU and registry.default_backend == CPU
    served = [CPU if backend == EDGETPU and all_fell_back else backend for backend in configured]
    return list(dict.fromkeys(served))


def with_backend_enum(schema: dict, backends: list[str]) -> dict:
    """A copy of `schema` whose `backend` query parameters accept exactly `backends`."""
    schema = copy.deepcopy(schema)
    for operation in (op for path in schema.get("paths", {}).values() for op in path.values()):
        for parameter in operation.get("parameters", []):
            if parameter.get("in") == "query" and parameter.get("name") == BACKEND_PARAMETER:
                parameter["schema"] = {"type": "string", "enum": backends, "title": "Backend"}
    return schema


def install(app: FastAPI, registry: Registry) -> None:
    generate = app.openapi  # FastAPI's own, which caches the static part

    def openapi() -> dict:
        return with_backend_enum(generate(), served_backends(registry))

    app.openapi = openapi
