"""DirectRoute: an APIRoute that reads its own path and query parameters, with no dependency solving.

FastAPI solves every route's dependencies per request (the signature walked, each parameter looked
up and validated through its machinery): on the inference routes that was ~40% of the event loop's
CPU for a refused request, which under overload is what sets how fast 503s come back. A
DirectRoute keeps the declaration FastAPI documents (the handler's signature: path parameters and
`Annotated[..., Query(...)]` parameters with their constraints, so the OpenAPI operation is what
FastAPI generates from it) and, per request, validates each parameter with a pydantic TypeAdapter
built once from that same declaration: the same values, the same 422 errors (RequestValidationError,
with FastAPI's `loc` and messages), no second description of a parameter to drift from the first.

It is FastAPI's documented extension point, a route class whose `get_route_handler()` makes the handler
(https://fastapi.tiangolo.com/how-to/custom-request-and-route/), and it reads no private name of FastAPI or
Starlette (tests/test_direct.py checks app/ for one). It goes direct only when that changes nothing: a
handler declared to return a Response, taking only the Request, path parameters and query parameters, on a
route without dependencies. Anything else, a Depends say, runs through FastAPI's own handler: slower, never
different. What a route cannot see from its own declaration is how it was included: `include_router(router,
prefix="/t/{tenant}", dependencies=[...])` adds path parameters and dependencies, and FastAPI builds a handler
per inclusion without saying which. So each handler settles it on its first request, from FastAPI's public
view of the app's routes (`fastapi.routing.iter_route_contexts`: each inclusion of a route, with its full path
and its dependencies; `included_path_parameters`). It goes direct when the inclusion that routed the request
adds no dependency; otherwise it runs FastAPI's own handler, which FastAPI built beside it for that inclusion.

A route class declares its checks: `checks = (check_inference_key,)` runs the API key check on each request
first, before the parameters are read, where FastAPI would have solved the dependency (on FastAPI's path too).
So API keys on a direct route are a check of its class, not a router-level dependency.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from fastapi import params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, compile_path

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
Check = Callable[[Request], None]

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


class _Reader:
    """A handler's arguments from a request, as FastAPI would give them (or its RequestValidationError)."""

    def __init__(self, parameters: Sequence[_Parameter]):
        self.path_names = frozenset(p.name for p in parameters if p.where == "path")
        self.path_params = [p for p in parameters if p.where == "path"]
        self.query_params = [p for p in parameters if p.where == "query"]
        self.request_names = [p.name for p in parameters if p.where == "request"]

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
        if info is not None and isinstance(info, params.Path) != (where == "path"):
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


def path_parameters(path: str) -> frozenset[str]:
    """The parameter names of a route path, as Starlette compiles it."""
    return frozenset(compile_path(path)[2])


def included_path_parameters(route: APIRoute, request: Request) -> frozenset[str] | None:
    """The path parameters of `route` as the app serves `request` on it, when the inclusion that routed the request
    adds no dependency; None otherwise, or when FastAPI's public view of the app does not show it: then only
    FastAPI's own handler knows what to run.

    The app's routes are tried in order, as the app's router tried them, up to the first full match: the entry
    (an included router, or the route itself) that routed the request; FastAPI's view of that entry
    (`iter_route_contexts`) gives each inclusion of the route in it with its full path and its dependencies. So
    nothing past that entry is built or read here (FastAPI builds an included router's routes at its first
    match: all of the app's, a few hundred ms at once)."""
    routes = getattr(request.app, "routes", None)
    if routes is None:
        return None
    for entry in routes:
        if entry.matches(request.scope)[0] is Match.FULL:
            break
    else:
        return None
    names = set()
    for context in iter_route_contexts([entry]):
        if context.original_route is not route:
            continue
        dependencies = getattr(context, "dependencies", None)
        if not isinstance(dependencies, list | tuple) or dependencies:
            return None
        names.add(path_parameters(context.path))
    return names.pop() if len(names) == 1 else None


_UNSETTLED = object()


class DirectRoute(APIRoute):
    """An APIRoute whose handler gets its parameters without FastAPI's dependency solving (see module)."""

    # Run on each request before its parameters are read (each raises, an HTTPException say, to refuse).
    checks: ClassVar[tuple[Check, ...]] = ()

    def get_route_handler(self) -> Handler:
        # FastAPI's own handler, for the inclusion being built: what runs when going direct would not be the same.
        solved = self._checked(super().get_route_handler())
        if self.dependencies:
            return solved
        own = direct_parameters(self, set(self.param_convertors))
        if own is None:
            return solved
        checks = self.checks
        reader: Any = _UNSETTLED
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            nonlocal reader
            if reader is _UNSETTLED:  # this handler's first request: how is the route included?
                reader = self._settle(request, own)
            if reader is None:
                return await solved(request)
            for check in checks:
                check(request)
            return await endpoint(**reader.arguments(request))

        return handle

    def _settle(self, request: Request, own: list[_Parameter]) -> _Reader | None:
        path_names = included_path_parameters(self, request)
        if path_names is None:
            return None
        if path_names == path_parameters(self.path):
            return _Reader(own)
        parameters = direct_parameters(self, set(path_names))  # a prefix with parameters of its own
        return None if parameters is None else _Reader(parameters)

    def _checked(self, handler: Handler) -> Handler:
        checks = self.checks
        if not checks:
            return handler

        async def handle_checked(request: Request) -> Response:
            for check in checks:
                check(request)
            return await handler(request)

        return handle_checked


class AnsweringRoute(DirectRoute):
    """A DirectRoute whose protocol answers its own failures, without leaving the route (the connection kept, the
    body in the protocol's shape): `failure(request, error)` gives the answer, or None to let the app's handlers
    answer it."""

    @staticmethod
    def failure(request: Request, error: Exception) -> Response | None:
        return None

    def get_route_handler(self) -> Handler:
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
