"""A handler's path and query parameters, read from its own declaration: what the door routes in front of FastAPI
(app/api/routes.py) hand their handlers, without FastAPI's per-request dependency solving.

A door route keeps the declaration FastAPI documents: the handler's signature, its path parameters and its
`Annotated[T, Query(...)]` (or `Annotated[T, Field(...)]`) query parameters with their constraints, from which
FastAPI makes the OpenAPI operation. `reader(route)` builds, once, a pydantic TypeAdapter per parameter from that
same declaration, and per request gives the same values and the same 422 errors (RequestValidationError, with
FastAPI's `loc` and messages) as FastAPI's handler: no second description of a parameter to drift from the first
(tests/test_routes.py asks both the same questions). FastAPI's dependency solving cost about 40 us of the event
loop's CPU per request here (FastAPI 0.165, a route with three query parameters, 2-core x86-64), a quarter of what
a refused /v1 classify costs in all.

It reads what can be read without FastAPI's machinery: the Request, path parameters and scalar query parameters,
of a coroutine declared to return a Response. Anything else (a Depends, a body, a header, a list in the query) is
None: FastAPI's own handler runs that route.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from starlette.requests import Request
from starlette.responses import Response

_MISSING = object()


@dataclass(frozen=True)
class Parameter:
    name: str  # the handler's argument
    alias: str  # the name in the URL
    where: str  # "path", "query", or "request"
    adapter: TypeAdapter | None  # None: a plain str, taken as it is
    default: Any  # _MISSING when required

    def read(self, source, values: dict, errors: list) -> None:
        raw = source.get(self.alias)
        if raw is None:
            if self.default is _MISSING:
                errors.append({"type": "missing", "loc": (self.where, self.alias), "msg": "Field required",
                               "input": None})
            else:
                values[self.name] = self.default
            return
        if self.adapter is None:
            values[self.name] = raw
            return
        try:
            values[self.name] = self.adapter.validate_python(raw)
        except ValidationError as e:
            errors.extend({**error, "loc": (self.where, self.alias, *error["loc"])}
                          for error in e.errors(include_url=False))


class Reader:
    """A handler's arguments from a request, as FastAPI would give them (or its RequestValidationError)."""

    def __init__(self, parameters: Sequence[Parameter]):
        self.path_params = [p for p in parameters if p.where == "path"]
        self.query_params = [p for p in parameters if p.where == "query"]
        self.request_names = [p.name for p in parameters if p.where == "request"]

    def query_parameter(self, name: str) -> Parameter | None:
        return next((p for p in self.query_params if p.name == name), None)

    def arguments(self, request: Request) -> dict[str, Any]:
        values: dict[str, Any] = {name: request for name in self.request_names}
        errors: list = []
        for p in self.path_params:
            p.read(request.path_params, values, errors)
        if self.query_params:
            if request.scope["query_string"]:
                query = request.query_params
                for p in self.query_params:
                    p.read(query, values, errors)
            else:  # the usual case: every default
                for p in self.query_params:
                    p.read({}, values, errors)
        if errors:
            raise RequestValidationError(errors)
        return values


def reader(route: APIRoute) -> Reader | None:
    """The handler's parameters as they are read in front of FastAPI, or None where they cannot be (FastAPI's own
    handler runs the route)."""
    endpoint = route.endpoint
    if not inspect.iscoroutinefunction(endpoint) or route.dependencies:
        return None
    signature = inspect.signature(endpoint)
    hints = typing.get_type_hints(endpoint, include_extras=True)
    returns = hints.get("return", signature.return_annotation)
    if not (inspect.isclass(returns) and issubclass(returns, Response)):
        return None  # what it returns would need FastAPI's serialization
    path_names = set(route.param_convertors)
    found = []
    for name, parameter in signature.parameters.items():
        annotation = hints.get(name, parameter.annotation)
        base, metadata = annotation, ()
        if typing.get_origin(annotation) is Annotated:
            base, *metadata = typing.get_args(annotation)
        declared = [m for m in metadata if isinstance(m, FieldInfo | params.Depends)]
        default = parameter.default
        if isinstance(default, FieldInfo | params.Depends):
            return None  # the old `x = Query(...)` form: not needed here
        if base is Request:
            found.append(Parameter(name, name, "request", None, _MISSING))
            continue
        if len(declared) > 1 or any(isinstance(m, params.Depends) or (isinstance(m, params.Param) and not
                                    isinstance(m, params.Path | params.Query)) for m in declared):
            return None  # Depends, Header, Body, File, ...
        info = declared[0] if declared else None
        where = "path" if name in path_names else "query"
        if isinstance(info, params.Path) and where != "path":
            return None
        if where == "path" and base is str and info is None:
            found.append(Parameter(name, name, "path", None, _MISSING))
            continue
        if not _scalar(base):
            return None  # lists and models in a query string: FastAPI's own rules
        alias = (info.alias if info is not None else None) or name
        required = default is inspect.Parameter.empty
        adapter = TypeAdapter(Annotated[base, info] if info is not None else base)
        found.append(Parameter(name, alias, where, adapter, _MISSING if required else default))
    return Reader(found)


def _scalar(annotation) -> bool:
    """A str, int, float or bool, a Literal of them, or one of these or None."""
    if typing.get_origin(annotation) is typing.Literal:
        return True
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(a in (str, int, float, bool) or typing.get_origin(a) is typing.Literal for a in args)
