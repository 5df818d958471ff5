"""The inference routes, in one table: declared once, on the router, and read by everyone who must know them.

A route is an inference route when its router's route class declares `inference = Inference(protocol, head)`:
its protocol (the `protocol` label of the request counter) and how its request head names a task, a model and
a backend (`Head`). Each door declares its route class where its router is (app/api/classify.py
`ClassifyRoute`, app/api/deepstack.py `DeepStackDetectionRoute`, app/api/v2/router.py `V2InferenceRoute`, ...);
a subclass inherits the declaration, so a protocol's routes that run no model have a class of their own without
it (`DeepStackRoute`, `V2Route`).
`InferenceRoutes.of(...)`, over the routes of the inference routers (app/api/doors.py), is then the table, and
it is read by
  - load shedding from the head (app/api/shedding.py HeadAdmission): which requests to place, and where;
  - the request counter (app/api/metrics.py RequestCounter): which requests to count, under which protocol
    (and under which model and backend: the door notes what the core returns, app/api/held.py, or the
    request counts under model="" and backend="");
  - admission: the head's (task, model, backend) goes to the core's own resolution (Core.check_room), the
    one a request's hold makes (Core.hold).
So a new inference endpoint is shed, counted and admitted by being declared on an inference router;
nothing else lists it (tests/test_routes.py adds one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from app.tasks import Task

# (path parameters, raw query string) -> (the task the route answers or None for any, the model or None for the
# task's default, the backend or None for the default), or None when the head alone cannot place the request
# (the application answers it).
Head = Callable[[dict[str, str], bytes], "tuple[Task | None, str | None, str | None] | None"]


@dataclass(frozen=True)
class Inference:
    """What a route class declares to make its routes inference routes (`inference = Inference(...)`)."""
    protocol: str
    head: Head
    # what the protocol's error bodies carry beside "error" (DeepStack's "success": false): a refusal from the head
    # answers {**error_fields, "error": ...}
    error_fields: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class InferenceRouteEntry:
    protocol: str
    path: str  # as declared, prefixes included
    pattern: re.Pattern[str]  # Starlette's own, with a group per path parameter
    head: Head
    error_fields: dict = field(default_factory=dict)  # what the protocol's error bodies carry beside "error"


class InferenceRoutes:
    """The POST routes among `routes` whose class declares an `Inference`, in routing order."""

    def __init__(self, entries: Iterable[InferenceRouteEntry]):
        self.entries = tuple(entries)
        # One regex for all (per request one match, not one per route): the routes' own patterns as
        # alternatives, their groups renamed apart, each closed by an empty group `_N` that names the
        # route matched (the last group closed).
        alternatives, self._groups = [], []
        for i, entry in enumerate(self.entries):
            pattern = entry.pattern.pattern.removeprefix("^").removesuffix("$")
            alternatives.append(re.sub(r"\(\?P<(\w+)>", rf"(?P<\1_{i}>", pattern) + f"(?P<_{i}>)")
            self._groups.append([(name, f"{name}_{i}") for name in entry.pattern.groupindex])
        self._any = re.compile("^(?:" + "|".join(alternatives) + ")$") if alternatives else None

    @classmethod
    def of(cls, routes: Iterable) -> InferenceRoutes:
        return cls(InferenceRouteEntry(inference.protocol, route.path, route.path_regex, inference.head,
                                       dict(inference.error_fields))
                   for route in routes
                   if isinstance(inference := getattr(route, "inference", None), Inference)
                   and "POST" in (getattr(route, "methods", None) or ()))

    def match(self, path: str) -> tuple[InferenceRouteEntry, dict[str, str]] | None:
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
        return None if found is None else self.entries[int(found.lastgroup[1:])].protocol

    @property
    def paths(self) -> list[str]:
        return [entry.path for entry in self.entries]


def v1_head(task: Task) -> Head:
    """The head of a route of `task` that names its model in the path (`name`, else the task's default) and its
    backend in the query (`backend`), as its handler reads them."""

    def head(parameters: dict[str, str], query: bytes) -> tuple[Task, str | None, str | None]:
        return task, parameters.get("name"), query_value(query, "backend")

    return head


def query_value(query: bytes, name: str) -> str | None:
    """A query parameter as the application reads it: decoded, the last of repeated ones (Starlette's rule)."""
    return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get(name)
