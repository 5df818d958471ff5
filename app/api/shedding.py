"""Load shedding from the request head: a full line answers 503 before the request reaches the app.

Under overload most requests are refused, and each refusal through the application (a task, the
middleware, routing, the handler, the error handler) cost ~0.55 ms of event-loop CPU; the same
503 written by the HTTP server as soon as the head is parsed costs ~0.2 ms, a new connection
included (bench/hostile.py --only overload). `HeadAdmission` is the check the server calls
(app/http_server.py `head_check`): for a POST to an inference route it runs the room check
`registry.lease()` would run, on the same pool, and refuses with the same message and
Retry-After. Everything else, and every request it cannot place (an unknown model or backend, an
encoded path), goes on to the application, which answers it as before.

A refusal here comes before the application's own checks: when the line is full, a request without a
valid key, or with a bad parameter (a top_k over the limit), gets the 503 too (it says nothing about
the keys, and the 401 or 422 would cost the loop as much as the refusal). Each is counted in
Prometheus like any other answer. A pipelined request (sent before the previous one's answer) goes
to the application, which answers in order.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from app import metrics
from app.api.v2.infer import VERSION
from app.errors import Busy, DeviceHung
from app.http_server import Refusal
from app.registry import Registry

# The inference routes (app/api/classify.py, app/api/v2/router.py): protocol label and model name.
V1_CLASSIFY = re.compile(rb"/v1/(?:models/([^/]+)/)?classify")
V2_INFER = re.compile(rb"/v2/models/([^/]+)(?:/versions/" + VERSION.encode() + rb")?/infer")


class HeadAdmission:
    """The room check of the inference routes, from a request's method and target alone."""

    def __init__(self, registry: Registry):
        self.registry = registry

    def __call__(self, method: bytes, target: bytes) -> Refusal | None:
        if method != b"POST":
            return None
        path, _, query = target.partition(b"?")
        if match := V1_CLASSIFY.fullmatch(path):
            protocol = "v1"
            name = match.group(1)
            backend = _query_value(query, b"backend")
        elif match := V2_INFER.fullmatch(path):
            protocol, name, backend = "v2", match.group(1), None  # a v2 body may name another: not read
        else:
            return None
        if name is not None and b"%" in name:
            return None  # percent-encoded: the application decodes and answers it
        return self._check(protocol, name.decode("ascii") if name else self.registry.settings.default_model,
                           backend)

    def _check(self, protocol: str, name: str, backend: str | None) -> Refusal | None:
        version = self.registry.serving(name)
        if version is None:
            return None
        key = self.registry.default_backend if backend is None else backend
        pool = version.pools.get(key)
        if pool is None:
            return None
        try:
            pool.check_room()
        except (Busy, DeviceHung) as e:
            metrics.answered(protocol, name, key, 503)
            return Refusal(503, str(e), {"Retry-After": str(int(e.retry_after_s))})
        return None


def _query_value(query: bytes, name: bytes) -> str | None:
    """A query parameter as the application reads it: decoded, the last of repeated ones (Starlette's rule)."""
    return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get(name.decode())
