"""The HTTP server: uvicorn with httptools, plus the limits uvicorn lacks, answered in JSON.

uvicorn alone (0.54, httptools parser) accepts a request head of any size (a 32 MiB header
got a 200, 96 MiB froze the loop), has no deadline for a head or body that trickles in
(slow clients held for minutes), answers parser errors and `limit_concurrency` in plain
text, and counts that limit per request, after the head is read. LimitedHttpToolsProtocol
adds, per connection:

  head:        request line + headers over MAX_HEADER_BYTES -> 431
  deadlines:   head not complete within HEADER_TIMEOUT_S of the connection (or of the
               previous response) -> 408; body not complete within BODY_TIMEOUT_S of
               the application asking for it -> 408
  connections: over MAX_CONNECTIONS open -> 503 at connect, before anything is read
  parse error: 400 with the parser's reason
  head check:  the app's own refusal from the head alone (a full line: app/api/shedding.py)
               -> its status, before the request reaches the application

each as {"error": "..."} with `Connection: close`. A refused connection is half-closed and
drained for LINGER_S, so the client reads the answer instead of a reset. Graceful shutdown
is uvicorn's own (timeout_graceful_shutdown = DRAIN_TIMEOUT_S); a second SIGTERM ends the drain
at once. Under `python -m app` the server is one of the service's doors (`ServerDoor`, app/service.py). The keep-alive timeout is the protocol's too, so every launch idles connections alike.

The protocol takes its limits and head check from the app: the app's lifespan puts them in the
ASGI lifespan state (`lifespan_state()`), which uvicorn hands to each connection's protocol. So
any server that runs this protocol on the app holds the same limits, whatever started it
(`python -m app`, uvicorn's command line, gunicorn: app/launch.py), with no other wiring.

This is the one module that reaches into uvicorn past its public configuration: uvicorn has no public
hook for a head cap, head and body deadlines or a check of the head, so LimitedHttpToolsProtocol
subclasses its httptools protocol (its constructor, `data_received`, the parser callbacks, three private
helpers, a few attributes of the protocol and of its request cycle). tests/test_http_server.py names
each of them (PROTOCOL_METHODS, PROTOCOL_ATTRIBUTES, ...) and fails first, by name, on a uvicorn that
changed one; uvicorn is pinned within the minor version they were read from (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.settings import Settings

log = logging.getLogger(__name__)

# Request line framing not seen by the parser callbacks: "METHOD SP ... SP HTTP/1.1 CRLF" + final CRLF.
LINE_OVERHEAD = 32
HEADER_OVERHEAD = 4  # ": " and CRLF
START_POLL_S = 0.05  # how often a starting server's door looks whether it listens yet


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    retry_after_s: int
    keep_alive_timeout_s: float
    linger_s: float  # a refused connection is drained (read and discarded) this long before it is closed

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(max_header_bytes=settings.max_header_bytes, header_timeout_s=settings.header_timeout_s,
                   body_timeout_s=settings.body_timeout_s, max_connections=settings.max_connections,
                   retry_after_s=settings.retry_after_s, keep_alive_timeout_s=settings.keep_alive_timeout_s,
                   linger_s=settings.linger_s)


@dataclass(frozen=True)
class Refusal:
    """An answer the server gives in the application's name, from a request's head alone."""
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    fields: dict = field(default_factory=dict)  # the protocol's error body beside "error" (DeepStack's "success")


# The application's check of a request head: (method, request target) -> a Refusal; or, to go on, None or
# entries to add to the request's ASGI scope (what the check found, for the application to read).
HeadCheck = Callable[[bytes, bytes], "Refusal | Mapping[str, Any] | None"]


# Where the app's lifespan state holds them (read by the protocol of each connection).
LIMITS_KEY = "edgetpu_serve.http_limits"
HEAD_CHECK_KEY = "edgetpu_serve.head_check"


def lifespan_state(limits: HttpLimits, head_check: HeadCheck | None) -> dict[str, Any]:
    """What the app's lifespan yields so that the server's protocol applies these limits."""
    return {LIMITS_KEY: limits, HEAD_CHECK_KEY: head_check}


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request already answered."""


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   fields: dict | None = None) -> bytes:
    body = json.dumps({**(fields or {}), "error": message}).encode()
    lines = [STATUS_LINE[status], b"content-type: application/json\r\n",
             b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines += [b"\r\n", body]
    return b"".join(lines)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head cap, read deadlines and a connection cap."""

    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = app_state.get(LIMITS_KEY)
        if limits is None:  # not our app's lifespan (or lifespan off): the limits of the environment
            limits = app_state[LIMITS_KEY] = HttpLimits.from_settings(Settings())
            log.warning("the app set no HTTP limits; using those of the environment (EDGETPU_SERVE_*)")
        self.limits: HttpLimits = limits
        self.head_check: HeadCheck | None = app_state.get(HEAD_CHECK_KEY)
        self.timeout_keep_alive = limits.keep_alive_timeout_s
        self._refused = False
        self._in_head = True  # between requests or inside a request's head
        self._in_body = False
        self._head_bytes = 0  # bytes received while in the head (a guard: one read's slack)
        self._head_size = 0  # the head's size from the parser's callbacks (exact to a few bytes)
        self._deadline: asyncio.TimerHandle | None = None

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"too many open connections (the limit is {self.limits.max_connections}); "
                              "retry later", {"Retry-After": str(self.limits.retry_after_s)})
            return
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # draining before close
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as e:
            if not self._refused:
                self._refuse(400, f"malformed HTTP request: {e}")
            return
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._head_too_large()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:
            self._refuse(400, f"malformed HTTP request: {msg}")

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_size = LINE_OVERHEAD
        if self._deadline is None:  # a keep-alive connection's next request
            self._head_bytes = 0
            self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + HEADER_OVERHEAD
        if self._head_size > self.limits.max_header_bytes:
            self._head_too_large()
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head_size > self.limits.max_header_bytes:
            self._head_too_large()
            raise _Refused
        self._in_head = False
        self._in_body = True
        self._disarm()
        previous = self.cycle  # a pipelined request's predecessor may still be answering: not ours to cut
        noted = None
        if self.head_check is not None and (previous is None or previous.response_complete):
            noted = self.head_check(self.parser.get_method(), self.url)
            if isinstance(noted, Refusal):  # no scope, no task, no middleware: a few tens of microseconds
                self._refuse(noted.status, noted.message, noted.headers, noted.fields)
                raise _Refused
        super().on_headers_complete()
        if noted:
            self.scope.update(noted)
        cycle = self.cycle
        if cycle is not None:
            receive = cycle.receive

            async def receive_with_deadline():
                # The body deadline runs from the application's first read, not from the end of the
                # head: time the request waits for memory or admission is not the client's.
                if self._in_body and self._deadline is None and not self._refused:
                    self._arm(self.limits.body_timeout_s, self._body_timed_out)
                return await receive()

            cycle.receive = receive_with_deadline  # type: ignore[method-assign]

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._in_head = True
        self._head_bytes = 0
        self._disarm()
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_body and self._deadline is None and not self.transport.is_closing():
            # answered before the body was read (413, 401 ...): the rest must still arrive in time
            self._arm(self.limits.body_timeout_s, self._body_timed_out)

    # -- refusals -----------------------------------------------------------------------------
    def _head_too_large(self) -> None:
        self._refuse(431, f"request line and headers exceed {self.limits.max_header_bytes} bytes")

    def _head_timed_out(self) -> None:
        self._deadline = None
        self._refuse(408, f"request headers not received within {self.limits.header_timeout_s:g} s")

    def _body_timed_out(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        self._refuse(408, f"request body not received within {self.limits.body_timeout_s:g} s")

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None,
                fields: dict | None = None) -> None:
        """Answer now, stop the request's application, drain for LINGER_S, close."""
        self._refused = True
        self._disarm()
        log.debug("%s: %d %s", self.client, status, message)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the application reads http.disconnect; its writes are dropped
            cycle.message_event.set()
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(error_response(status, message, headers, fields))
        if transport.can_write_eof():
            transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(self.limits.linger_s, transport.close)

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def config(app, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's Config with our protocol (the limits come from the app's lifespan); overrides win."""
    options: dict[str, Any] = dict(
        host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
        http=LimitedHttpToolsProtocol,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        limit_concurrency=None,  # ours is per connection, at connect, in JSON
        timeout_graceful_shutdown=settings.drain_timeout_s,
    )
    options.update(overrides)
    return uvicorn.Config(app, **options)


class _Server(uvicorn.Server):
    """A second SIGTERM ends the drain at once (uvicorn does so only for a second SIGINT)."""

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGTERM:
            self.force_exit = True
        super().handle_exit(sig, frame)


class _ServiceServer(_Server):
    """uvicorn's server as one of a Service's doors: the Service takes SIGTERM and SIGINT (app/service.py), not the
    server, which would otherwise set its own handlers for them while it serves (`Server.capture_signals`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ServerFailed(RuntimeError):
    """The HTTP server did not start (its address in use, say: uvicorn logged why); `status` is the exit status."""

    def __init__(self, status: int):
        super().__init__(f"the HTTP server did not start (status {status})")
        self.status = status


class ServerDoor:
    """The HTTP server as one of the Service's doors (python -m app): uvicorn with our protocol on the service's event
    loop, running `app`, whose lifespan hands the protocol its limits. Opened last, closed first: it stops accepting
    and lets its requests finish within DRAIN_TIMEOUT_S (uvicorn's graceful shutdown); `force()` ends that at once."""

    def __init__(self, app, settings: Settings, **overrides: Any):
        self.server = _ServiceServer(config(app, settings, **overrides))
        self.status: int | None = None  # the exit status uvicorn asked for, where it gave up
        self._serving: asyncio.Task | None = None

    def loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop] | None:
        """The event loop the server is made for (uvicorn's `loop`, auto: uvloop where it is installed); the service
        runs on it."""
        return self.server.config.get_loop_factory()

    async def start(self) -> None:
        """Serve; return once listening. ServerFailed where the server gave up instead (uvicorn logged why)."""
        self._serving = asyncio.ensure_future(self._serve())
        while not self.server.started:  # uvicorn says it listens only by this flag
            if self._serving.done():
                raise ServerFailed(self.status if self.status is not None else 3)
            await asyncio.wait({self._serving}, timeout=START_POLL_S)

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit as e:  # uvicorn exits where it cannot bind, or its app's startup failed
            self.status = e.code if isinstance(e.code, int) else 1

    async def stop(self) -> None:
        if self._serving is not None:
            self.server.should_exit = True
            await self._serving

    def force(self) -> None:
        """Stop waiting for the requests in flight (a second SIGTERM)."""
        self.server.force_exit = True

    def ready(self) -> str | None:
        return None

    def report(self) -> dict | None:
        return None
