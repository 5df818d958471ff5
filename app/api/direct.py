"""DirectRoute: an APIRoute that reads its own path and query parameters, with no dependency solving.

FastAPI solves every route's dependencies per request (the signature walked, each parameter looked
up and validated through its machinery): on the inference routes that was ~40% of the event loop's
CPU for a refused request, which under overload is what sets how fast 503s come back. A
DirectRoute keeps the declaration FastAPI documents (the handler's signature: path parameters and
`Annotated[..., Query(...)]` parameters with their constraints, so the OpenAPI operation is what
FastAPI generates from it) and, per request, validates each parameter with a pydantic TypeAdapter
built once from that same declaration: the same values, the same 422 errors (RequestValidationError,
with FastAPI's `loc` and messages), no second description of a parameter to drift from the first.

It goes direct only when that changes nothing: a handler declared to return a Response, taking only the
Request, path parameters and query parameters, on a route without dependencies (its own or its
router's inclusion). Anything else, a Depends say, runs through FastAPI's own handler as before:
slower, never different. So API keys on a direct route are checked in the handler, not by a
router-level dependency: `DirectRoute.checking(check_inference_key)` runs the check first, before
the parameters, where FastAPI solved the dependency.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import params, routing
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

_MISSING = object()


@dataclass(frozen=True)
class _Parameter:
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


def direct_parameters(route: APIRoute, path_names: set[str]) -> list[_Parameter] | None:
    """The handler's parameters as DirectRoute reads them, or None if it cannot (FastAPI's handler runs it).
    `path_names`: the parameters of the full path, prefixes included."""
    endpoint = route.endpoint
    if not inspect.iscoroutinefunction(endpoint):
        return None
    hints = typing.get_type_hints(endpoint, include_extras=True)
    returns = hints.get("return")
    if not (inspect.isclass(returns) and issubclass(returns, Response)):
        return None  # what it returns would need FastAPI's serialization
    found = []
    for name, parameter in inspect.signature(endpoint).parameters.items():
        annotation = hints.get(name, parameter.annotation)
        base, metadata = annotation, ()
        if typing.get_origin(annotation) is Annotated:
            base, *metadata = typing.get_args(annotation)
        declared = [m for m in metadata if isinstance(m, params.Param | params.Depends)]
        default = parameter.default
        if isinstance(default, params.Param | params.Depends):
            return None  # the old `x = Query(...)` form: not needed here
        if base is Request:
            found.append(_Parameter(name, name, "request", None, _MISSING))
            continue
        if len(declared) > 1 or any(not isinstance(m, params.Path | params.Query) for m in declared):
            return None  # Depends, Header, Body, File, ...
        info = declared[0] if declared else None
        where = "path" if name in path_names else "query"
        if info is not None and info.in_.value != where:
            return None
        if where == "path" and base is str and info is None:
            found.append(_Parameter(name, name, "path", None, _MISSING))
            continue
        if not _scalar(base):
            return None  # lists and models in a query string: FastAPI's own rules
        alias = (info.alias if info is not None else None) or name
        required = default is inspect.Parameter.empty
        adapter = TypeAdapter(Annotated[base, info] if info is not None else base)
        found.append(_Parameter(name, alias, where, adapter, _MISSING if required else default))
    return found


def _scalar(annotation) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(a in (str, int, float, bool) for a in args)


_UNKNOWN = object()


def _inclusion():
    """The router inclusion this handler is being built for (FastAPI builds one handler per
    inclusion, its path prefixed and its dependencies added), None for the route itself, or
    _UNKNOWN on a FastAPI without this hook: then the route falls back to FastAPI's own handler
    rather than risk skipping a dependency."""
    context_var = getattr(routing, "_effective_route_context_var", None)
    return _UNKNOWN if context_var is None else context_var.get()


class DirectRoute(APIRoute):
    """An APIRoute whose handler gets its parameters without FastAPI's dependency solving (see module)."""

    checks: tuple[Callable[[Request], None], ...] = ()

    @classmethod
    def checking(cls, *checks: Callable[[Request], None]) -> type[DirectRoute]:
        """This route class with `checks` run on each request before its parameters are read
        (each raises, an HTTPException say, to refuse). They run on FastAPI's path too."""
        return type(f"{cls.__name__}Checking", (cls,), {"checks": cls.checks + checks})

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        checks = self.checks
        inclusion = _inclusion()
        route = self if inclusion is None else inclusion
        parameters = None
        if inclusion is not _UNKNOWN and not getattr(route, "dependencies", [None]):
            parameters = direct_parameters(self, set(getattr(route, "param_convertors", self.param_convertors)))
        if parameters is None:
            solved = super().get_route_handler()

            async def handle_solved(request: Request) -> Response:
                for check in checks:
                    check(request)
                return await solved(request)

            return handle_solved if checks else solved
        endpoint = self.endpoint
        path_params = [p for p in parameters if p.where == "path"]
        query_params = [p for p in parameters if p.where == "query"]
        request_names = [p.name for p in parameters if p.where == "request"]

        async def handle(request: Request) -> Response:
            for check in checks:
                check(request)
            values: dict[str, Any] = {name: request for name in request_names}
            errors: list = []
            for p in path_params:
                p.read(request.path_params, values, errors)
            if query_params:
                if request.scope["query_string"]:
                    query = request.query_params
                    for p in query_params:
                        p.read(query, values, errors)
                else:  # the usual case: every default
                    for p in query_params:
                        p.read({}, values, errors)
            if errors:
                raise RequestValidationError(errors)
            return await endpoint(**values)

        return handle


class AnsweringRoute(DirectRoute):
    """A DirectRoute whose protocol answers its own failures, without leaving the route (the connection kept, the
    body in the protocol's shape): `failure(request, error)` gives the answer, or None to let the app's handlers
    answer it."""

    @staticmethod
    def failure(request: Request, error: Exception) -> Response | None:
        return None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        failure = self.failure

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as e:
                response = failure(request, e)
                if response is None:
                    raise
                return response

        return answer
