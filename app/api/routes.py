"""The front doors' routes in one table, generated from their declarations and put in front of FastAPI's router.

A front door's routes are a router whose route class is a DoorRoute (app/api/doors.py lists the doors, in the order
a request is matched against them). The class declares what every route of it shares:
  - `checks`: run first on each request (the inference API key), before its parameters are read;
  - `failure(request, error)`: the protocol's own answer to an error (DeepStack's shape), or None for the app's;
  - `inference = Inference(protocol, task)`: its routes run models, so they are counted under that protocol and
    placed from the request head: the model is the path parameter `name` (else the task's default) and the backend
    the query parameter `backend`, where the handler declares one.
`InferenceRoutes.of(routers)` is the table generated from the doors' routes, in order; it includes the routers in the
app (`include`: no prefix, no dependencies of the inclusion's own, so FastAPI's routes are the table's). It is read by
  - the app's router: `front`, a route ahead of all others, matches a POST to any door route with one regular
    expression (the routes' own patterns, as Starlette compiles them, as alternatives in routing order), reads its
    parameters from the handler's declaration (app/api/parameters.py), runs its checks and its handler and answers
    its failures as its protocol does. What it leaves (another method, a handler it cannot read) goes on to
    FastAPI's routes behind it, the same routes, which answer it the same way, only slower;
  - load shedding from the head (app/api/shedding.py HeadAdmission): `place(method, target)`, the task, the model
    and the backend of an inference request from its request line alone (Core.check_room then checks its line);
  - the request counter (app/api/metrics.py RequestCounter): `protocol_of(method, path)`.
So a new inference endpoint is shed, counted and admitted by being declared on a door's router; nothing else lists
it (tests/test_routes.py adds one). Matching every door route at once also spares a request the routes ahead of it:
FastAPI 0.165 tries them one by one, about 7 us each on a 2-core x86-64.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar
from urllib.parse import parse_qsl

from fastapi import APIRouter, FastAPI, Query
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound, request_response
from starlette.types import Receive, Scope, Send

from app.api.parameters import Reader, reader
from app.tasks import Task

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
Check = Callable[[Request], None]
Failure = Callable[[Request, Exception], "Response | None"]

# The parameters that place an inference request: its model (in the path) and its backend (in the query).
MODEL_PARAMETER = "name"
BACKEND_PARAMETER = "backend"
BackendQuery = Annotated[str | None, Query(max_length=32, description="a backend key, as GET /v1/models lists each "
                                                                      "model's; default: the first configured")]
# The request scope's key under which the front route says which door route it matched.
ENTRY_KEY = "edgetpu_serve.door_route"


@dataclass(frozen=True)
class Inference:
    """What a route class declares to make its routes inference routes (`inference = Inference(...)`)."""

    protocol: str
    task: Task | None = None  # the task its routes answer; None: a model of any task (a tensor protocol)
    # what the protocol's error bodies carry beside "error" (DeepStack's "success": false): a refusal from the head
    # answers {**error_fields, "error": ...}
    error_fields: Mapping = field(default_factory=dict)
    # False where the request names its model in its body (DOODS): the route checks the room once it has read it
    from_head: bool = True
    # path parameters the head places a request at only with these values (OIP v2's version "1"): a request for
    # another goes to its route, which answers it
    only: Mapping[str, str] = field(default_factory=dict)


def guarded(handler: Handler, checks: tuple[Check, ...], failure: Failure | None) -> Handler:
    """`handler` with `checks` run first and its failures answered by `failure` (where it answers them)."""
    if not checks and failure is None:
        return handler

    async def handle(request: Request) -> Response:
        try:
            for check in checks:
                check(request)
            return await handler(request)
        except Exception as e:
            response = failure(request, e) if failure is not None else None
            if response is None:
                raise
            return response

    return handle


class DoorRoute(APIRoute):
    """A route of a front door (see module): its checks, its failures' answer, its inference declaration. FastAPI's
    own handler, for what the front leaves to it, runs the same checks first and answers the same failures."""

    checks: ClassVar[tuple[Check, ...]] = ()
    inference: ClassVar[Inference | None] = None
    # the protocol's answer to an error raised by a route (None: the app's exception handlers answer it)
    failure: ClassVar[Failure | None] = None

    def get_route_handler(self) -> Handler:
        return guarded(super().get_route_handler(), self.checks, type(self).failure)


@dataclass(frozen=True)
class Entry:
    """One door route as the table knows it: its route, and what runs it in front (None: FastAPI, behind)."""

    route: APIRoute
    inference: Inference | None
    reader: Reader | None
    app: Callable[[Scope, Receive, Send], Coroutine] | None
    backend_alias: str | None  # its `backend` query parameter's name in the URL, where it declares one

    @classmethod
    def of(cls, route: APIRoute) -> Entry:
        inference = getattr(route, "inference", None)
        read = reader(route)
        app = None
        if read is not None:
            app = request_response(guarded(_direct(route.endpoint, read), getattr(route, "checks", ()),
                                           getattr(type(route), "failure", None)))
        backend = read.query_parameter(BACKEND_PARAMETER) if read is not None else None
        return cls(route, inference if isinstance(inference, Inference) else None, read, app,
                   backend.alias if backend is not None else None)


def _direct(endpoint: Callable, read: Reader) -> Handler:
    async def handle(request: Request) -> Response:
        return await endpoint(**read.arguments(request))

    return handle


class InferenceRoutes:
    """The POST routes of the doors' routers, in routing order (see module)."""

    def __init__(self, routers: Iterable[APIRouter]):
        self.routers = tuple(routers)
        self.entries = tuple(Entry.of(route) for router in self.routers for route in router.routes
                             if isinstance(route, APIRoute) and "POST" in (route.methods or ()))
        # One regex for all (per request one match, not one per route): the routes' own patterns as
        # alternatives, their groups renamed apart, each closed by an empty group `_N` that names the
        # route matched (the last group closed). The first alternative that matches is the route's that comes
        # first, as in FastAPI's own routing.
        alternatives, self._groups = [], []
        for i, entry in enumerate(self.entries):
            pattern = entry.route.path_regex.pattern.removeprefix("^").removesuffix("$")
            alternatives.append(re.sub(r"\(\?P<(\w+)>", rf"(?P<\1_{i}>", pattern) + f"(?P<_{i}>)")
            self._groups.append([(name, f"{name}_{i}") for name in entry.route.path_regex.groupindex])
        self._any = re.compile("^(?:" + "|".join(alternatives) + ")$") if alternatives else None
        self.front = Front(self)

    @classmethod
    def of(cls, routers: Iterable[APIRouter]) -> InferenceRoutes:
        """The table of the doors' routers, in routing order; the app gets it in front (`FastAPI(routes=[front])`),
        and the routers behind it (`include`)."""
        return cls(routers)

    def include(self, app: FastAPI) -> None:
        """The doors' routers into the app, as the table reads them: without a prefix or dependencies of the
        inclusion's own (a door's checks are its route class's), so what the front runs and what FastAPI would run
        behind it are the same routes."""
        for router in self.routers:
            app.include_router(router)

    def match(self, path: str) -> tuple[Entry, dict[str, str]] | None:
        """The route a POST to `path` (decoded, as in an ASGI scope) goes to, and its path parameters."""
        found = self._any.match(path) if self._any is not None else None
        if found is None:
            return None
        i = int(found.lastgroup[1:])
        return self.entries[i], {name: found.group(group) for name, group in self._groups[i]}

    def protocol_of(self, method: str, path: str) -> str | None:
        """The protocol label of a request to an inference route, None for any other request."""
        if method != "POST":
            return None
        found = self._any.match(path) if self._any is not None else None
        if found is None:
            return None
        inference = self.entries[int(found.lastgroup[1:])].inference
        return inference.protocol if inference is not None else None

    def place(self, method: bytes, target: bytes) -> tuple[Inference, Task | None, str | None, str | None] | None:
        """What an inference request's head says of where it goes (its route's declaration, its task, the model or
        None for the task's default, the backend or None for the default), or None where the head alone cannot
        place it: not an inference route, a percent-encoded path (the application decodes it), a model named in the
        body, a path parameter the head does not place at."""
        if method != b"POST":
            return None
        path, _, query = target.partition(b"?")
        if b"%" in path:
            return None
        found = self.match(path.decode("latin-1"))
        if found is None:
            return None
        entry, parameters = found
        inference = entry.inference
        if inference is None or not inference.from_head or entry.reader is None:
            return None
        for name, value in inference.only.items():
            if parameters.get(name, value) != value:
                return None
        backend = query_value(query, entry.backend_alias) if entry.backend_alias is not None and query else None
        return inference, inference.task, parameters.get(MODEL_PARAMETER), backend

    @property
    def paths(self) -> list[str]:
        """The inference routes' paths, in routing order."""
        return [entry.route.path for entry in self.entries if entry.inference is not None]


class Front(BaseRoute):
    """The door routes' route in front of the app's others (see module): a POST to one it can run is matched and
    run here; anything else goes on to FastAPI's routes."""

    def __init__(self, table: InferenceRoutes):
        self.table = table

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return Match.NONE, {}
        found = self.table.match(scope["path"])
        if found is None or found[0].app is None:
            return Match.NONE, {}
        entry, parameters = found
        convertors = entry.route.param_convertors
        path_params = {name: convertors[name].convert(value) for name, value in parameters.items()}
        return Match.FULL, {"endpoint": entry.route.endpoint, "path_params": path_params, "route": entry.route,
                            ENTRY_KEY: entry}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope[ENTRY_KEY].app(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any):
        raise NoMatchFound(name, path_params)  # the routes behind name themselves


def query_value(query: bytes, name: str) -> str | None:
    """A query parameter as the application reads it: decoded, the last of repeated ones (Starlette's rule)."""
    return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get(name)
