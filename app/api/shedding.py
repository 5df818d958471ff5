"""Load shedding from the request head: a full line answers 503 before the request reaches the app.

Under overload most requests are refused, and each refusal through the application (a task, the
middleware, routing, the handler, the error handler) cost ~0.55 ms of event-loop CPU; the same
503 written by the HTTP server as soon as the head is parsed costs ~0.2 ms, a new connection
included (bench/hostile.py --only overload). `HeadAdmission` is the check the server calls
(app/http_server.py `head_check`): for a POST to an inference route (the table, app/api/routes.py, places it
from the route's declaration: its task, the model in its path, the backend in its query) it has the core make the
request's room check (Core.check_room: the pool its hold would check), and refuses
with the same message and Retry-After; a request with room goes on with the check noted in its scope
(app/api/held.py ROOM_CHECKED), so it is checked once. Everything else, and every request it cannot place
(an unknown model or backend, an encoded path), goes on to the application, which answers it as before.

A refusal here comes before the application's own checks: when the line is full, a request without a
valid key, or with a bad parameter (a top_k over the limit), gets the 503 too (it says nothing about
the keys, and the 401 or 422 would cost the loop as much as the refusal). Each is counted in
Prometheus like any other answer. A pipelined request (sent before the previous one's answer) goes
to the application, which answers in order.
"""

from __future__ import annotations

from collections.abc import Mapping

from app import metrics
from app.api.held import ROOM_CHECKED
from app.api.routes import InferenceRoutes
from app.core import Core
from app.errors import Busy
from app.http_server import Refusal

CHECKED = {ROOM_CHECKED: True}  # what a request with room carries into the application


class HeadAdmission:
    """The room check of the inference routes, from a request's method and target alone."""

    def __init__(self, core: Core, routes: InferenceRoutes):
        self.core = core
        self.routes = routes

    def __call__(self, method: bytes, target: bytes) -> Refusal | Mapping[str, bool] | None:
        placed = self.routes.place(method, target)
        if placed is None:
            return None
        inference, task, model, backend = placed
        try:
            checked = self.core.check_room(task, model, backend)
        except Busy as e:  # and DeviceHung
            where = e.target
            metrics.answered(inference.protocol, where.model, where.backend, 503)
            return Refusal(503, str(e), {"Retry-After": str(int(e.retry_after_s))}, inference.error_fields)
        return None if checked is None else CHECKED
