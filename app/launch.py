"""How servers other than `python -m app` start the service, and the refusal where one cannot hold its limits.

The HTTP limits (request head size, head and body deadlines, connection cap, keep-alive: app/http_server.py)
live in the HTTP protocol, below anything an ASGI app sees: a server that runs its own protocol runs
without them (measured with uvicorn 0.54's own: a 1 MiB header answered 200, clients trickling their
bodies never dropped; docs/launch.md). So the app starts under a server only where that server runs
our protocol, and otherwise it refuses before any model loads, with a message that says how to start it:

  python -m app                                                       settings from EDGETPU_SERVE_*
  uvicorn --http app.launch:Protocol app.main:app                     (or --factory app.main:create_app)
  gunicorn -c python:app.gunicorn_conf app.main:app                   N workers, each with its TPUs; no --preload

How it is known: `Protocol` here is looked up by that name only, by uvicorn resolving `--http`
(uvicorn.Config.load, after which the lifespan starts: pinned with uvicorn), so looking it up marks
the process; the gunicorn worker marks it itself (app/gunicorn_worker.py). An app built for another
server (`app.main:app`, `create_app()` without settings) checks the mark when its lifespan starts,
before any model loads, and refuses there: `uvicorn app.main:app` or `--factory app.main:create_app`
with uvicorn's own protocol, gunicorn with uvicorn's own worker, and any other server. The refusal is the
message alone: the startup fails through the ASGI lifespan protocol (RefuseOtherServers), so the server
prints no traceback after it, and the process exits non-zero. The limits themselves then reach the
protocol through the app's lifespan state, whoever started it.

Every launch reads its settings here first (settings_from_environment: the core's, every plug-in's own, the
backends named): a wrong value stops it before anything loads, with one line that names each wrong setting by its
variable and says what to do (app/settings.py settings_problem), and no traceback: `python -m app` exits 2, a
server CANNOT_START.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from pydantic import ValidationError
from pydantic_settings import SettingsError

from app import processes
from app.engines import BACKENDS
from app.errors import ServeError
from app.memory import tune_malloc
from app.settings import ENV_PREFIX, Settings, settings_problem

# The exit status of an app that cannot be built under another server: gunicorn's "App failed to load"
# (its arbiter stops instead of starting the worker again and again). A launch refused at lifespan
# start exits as any failed startup: 3 from uvicorn, and gunicorn's arbiter stops on it too.
CANNOT_START = 4
# The exit status of a gunicorn worker that refuses at boot: gunicorn's "Worker failed to boot", on which its
# arbiter stops; an exit, so that nothing prints a traceback after the refusal.
REFUSED_AT_BOOT = 3

PROTOCOL_NAME = "Protocol"
HOW_TO_START = """Start it with one of:
  python -m app                          (host, port and every setting from EDGETPU_SERVE_*)
  uvicorn --http app.launch:Protocol app.main:app --host HOST --port PORT
  gunicorn -c python:app.gunicorn_conf [--workers N] [--bind HOST:PORT] app.main:app
(see docs/launch.md)"""



class ThisProcess:
    """How this process was launched. Module state, because a launch is the process's: the server that runs it says
    once whether it runs our protocol, and looks an entry point up more than once for one app."""

    def __init__(self) -> None:
        self.runs_our_protocol = False
        self.built: dict[str, Any] = {}  # entry point -> its app


THIS_PROCESS = ThisProcess()


class LaunchRefused(RuntimeError):
    """The server that started the app does not run its HTTP protocol (the message says how to start it)."""


def __getattr__(name: str) -> Any:
    """`app.launch:Protocol`, the name uvicorn's `--http` is given: our protocol, and the mark that it is used.

    A module attribute looked up by name, because the lookup is the event to notice: uvicorn resolves `--http`
    with getattr on this module before the app's lifespan starts, and nothing else tells an app which protocol
    its server runs. A plain `Protocol = LimitedHttpToolsProtocol` would be there whether or not uvicorn was told
    to use it; importing this module marks nothing (docs/launch.md)."""
    if name == PROTOCOL_NAME:
        THIS_PROCESS.runs_our_protocol = True
        from app.http_server import LimitedHttpToolsProtocol

        return LimitedHttpToolsProtocol
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mark_protocol_in_use() -> None:
    """For a launcher that runs our protocol itself (the gunicorn worker)."""
    THIS_PROCESS.runs_our_protocol = True


def refusal(why: str) -> str:
    return f"edgetpu-serve: refusing to start: {why}\n{HOW_TO_START}"


def refuse(why: str) -> NoReturn:
    """For a launcher that refuses as it boots (the gunicorn worker): the refusal, then the exit."""
    print(refusal(why), file=sys.stderr, flush=True)  # before the server's own account of the failure
    raise SystemExit(REFUSED_AT_BOOT)


class RefuseOtherServers:
    """The app another server loads (`entry`), wrapped: at lifespan start, unless that server runs our protocol,
    the refusal and a failed startup, before any model loads; everything else passes through untouched.

    The startup fails through the ASGI lifespan protocol itself (`lifespan.startup.failed`, with no message of
    its own: the refusal is printed first), not by raising from the app's lifespan, where Starlette would hand
    the server a traceback to print after the refusal. LaunchRefused is raised then, for whoever runs the
    lifespan without a server (a test client); a server told that the startup failed ignores it (uvicorn, then
    "Application startup failed. Exiting.", status 3)."""

    def __init__(self, app: Any, entry: str):
        self.app = app
        self.entry = entry

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan" and not THIS_PROCESS.runs_our_protocol:
            await receive()  # lifespan.startup
            why = (f"{self.entry} was started by a server that does not run the service's HTTP protocol, so its "
                   "limits (request head size, head and body deadlines, connection cap) would not hold.")
            print(refusal(why), file=sys.stderr, flush=True)
            await send({"type": "lifespan.startup.failed", "message": ""})
            raise LaunchRefused("started without the service's HTTP protocol: see the message above")
        await self.app(scope, receive, send)


class SettingsRefused(ValueError):
    """The environment's settings cannot start the service: the message, one line, names each setting wrong by its
    variable and says what to do."""


def settings_from_environment() -> Settings:
    """The core's settings from EDGETPU_SERVE_*, with every plug-in's own read and checked too (the start makes every
    available plug-in: app/registry/startup.py) and the backends named known: a wrong value of any stops a launch
    here, before a model loads. SettingsRefused, in one line, otherwise."""
    problems = []
    try:
        settings = Settings()
    except (ValidationError, SettingsError) as e:
        settings = None
        problems.append(settings_problem(e))
    if settings is not None:
        unknown = [key for key in settings.backends if key not in BACKENDS]
        if unknown:
            problems.append(f"{ENV_PREFIX}BACKENDS={','.join(settings.backends)!r}: no backend {', '.join(unknown)} "
                            f"here. Fix: name backends among {', '.join(BACKENDS)}")
    for plugin in BACKENDS.values():
        if plugin.settings_class is None:
            continue
        try:  # each plug-in's own variables, whether or not the core's are right: every wrong value said at once
            if settings is None:
                plugin.settings_class()
            else:
                settings.plugin_settings(plugin)
        except (ValidationError, SettingsError) as e:
            problems.append(settings_problem(e, plugin.settings_class))
    if problems:
        raise SettingsRefused("; ".join(problems))
    return settings


def environment_settings() -> Settings:
    """The settings from the environment, for a server's launch; invalid ones stop it with one line saying which and
    what to do (SettingsRefused), and the servers' "app failed to load" status, with no traceback."""
    try:
        return settings_from_environment()
    except SettingsRefused as e:
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr, flush=True)
        raise SystemExit(CANNOT_START) from None


def app_for_server(entry: str, create_app: Callable[[Settings], Any]) -> Any:
    """The app `entry` names, built once from the environment's settings, wrapped so that its lifespan refuses a
    server that does not run our protocol (RefuseOtherServers) before anything loads."""
    built = THIS_PROCESS.built
    if entry in built:
        return built[entry]
    settings = environment_settings()
    slot = processes.current()
    if slot is not None:  # one of several workers: its share of the TPUs and of the host's limits
        settings = processes.process_settings(settings, slot)
    if settings.tune_malloc:
        tune_malloc()
    try:
        app = create_app(settings)
    except ServeError as e:
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr, flush=True)
        raise SystemExit(CANNOT_START) from None
    app.add_middleware(RefuseOtherServers, entry=entry)  # outermost: it sees the lifespan first
    built[entry] = app
    return app
