"""The OpenAPI description, completed with what only the running process knows: the backends it serves and its limits.

`backend` is a plain string to the handlers; in the description it is an enum of this process's
backends, so a client or a fuzzer that follows the schema asks only for backends that can answer.
A value outside the enum, or a backend the model is not served on, is refused as any other schema
violation: 422, naming the backends that are served (app.errors.BackendNotAvailable).
"""

from __future__ import annotations

import copy

from fastapi import FastAPI

from app.core import Core

BACKEND_PARAMETER = "backend"
TOP_K_PARAMETER = "top_k"


def completed(schema: dict, backends: list[str], max_top_k: int) -> dict:
    """A copy of `schema` whose `backend` query parameters accept exactly `backends`, and whose
    `top_k` parameters stop at the process's MAX_TOP_K."""
    schema = copy.deepcopy(schema)
    for operation in (op for path in schema.get("paths", {}).values() for op in path.values()):
        for parameter in operation.get("parameters", []):
            if parameter.get("in") != "query":
                continue
            if parameter.get("name") == BACKEND_PARAMETER:
                parameter["schema"] = {"type": "string", "enum": backends, "title": "Backend"}
            elif parameter.get("name") == TOP_K_PARAMETER:
                parameter["schema"]["maximum"] = max_top_k
    return schema


def install(app: FastAPI, core: Core, max_top_k: int) -> None:
    generate = app.openapi  # FastAPI's own, which caches the static part

    def openapi() -> dict:
        return completed(generate(), core.backends(), max_top_k)

    app.openapi = openapi
