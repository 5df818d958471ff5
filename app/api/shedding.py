"""Load shedding from the request head: a full line answers 503 before the request reaches the app.

Under overload most requests are refused, and each refusal through the application (a task, the
middleware, routing, the handler, the error handler) cost ~0.55 ms of event-loop CPU; the same
503 written by the HTTP server as soon as the head is parsed costs ~0.2 ms, a new connection
included (bench/hostile.py --only overload). `HeadAdmission` is the check the server calls
(app/http_server.py `head_check`): for a POST to an inference route (the table, app/api/routes.py)
it asks the registry for the pool `registry.lease()` would check (Registry.pool_for), runs the same
room check, and refuses with the same message and Retry-After. Everything else, and every request
it cannot place (an unknown model or backend, an encoded path), goes on to the application, which
answers it as before.

A refusal here comes before the application's own checks: when the line is full, a request without a
valid key, or with a bad parameter (a top_k over the limit), gets the 503 too (it says nothing about
the keys, and the 401 or 422 would cost the loop as much as the refusal). Each is counted in
Prometheus like any other answer. A pipelined request (sent before the previous one's answer) goes
to the application, which answers in order.
"""

from __future__ import annotations

from app import metrics
from app.api.routes import InferenceRoutes
from app.errors import Busy
from app.http_server import Refusal
from app.registry import Registry


class HeadAdmission:
    """The room check of the inference routes, from a request's method and target alone."""

    def __init__(self, registry: Registry, routes: InferenceRoutes):
        self.registry = registry
        self.routes = routes

    def __call__(self, method: bytes, target: bytes) -> Refusal | None:
        if method != b"POST":
            return None
        path, _, query = target.partition(b"?")
        if b"%" in path:
            return None  # percent-encoded: the application decodes and answers it
        found = self.routes.match(path.decode("latin-1"))
        if found is None:
            return None
        route, parameters = found
        placed = route.head(self.registry, parameters, query)
        if placed is None:
            return None
        name, backend = placed
        room = self.registry.pool_for(name, backend)
        if room is None:
            return None
        key, pool = room
        try:
            pool.check_room()
        except Busy as e:  # and DeviceHung
            metrics.answered(route.protocol, name, key, 503)
            return Refusal(503, str(e), {"Retry-After": str(int(e.retry_after_s))}, route.error_fields)
        return None
