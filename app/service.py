"""The service, composed from its settings: the registry (every model directory checked now), the image threads, the
core, the worker group's line when several processes serve one port (app/processes), and every front door the
settings ask for. It starts and stops them in order and imports no web framework: HTTP is one door among others.

    service = Service(settings)             # a ServeError here stops the start, saying why
    service.open_http()                     # python -m app: the HTTP server, the last door to open
    await service.serve()                   # start; serve until SIGTERM or SIGINT; stop

Under another server (gunicorn, `uvicorn --factory`), that server runs the HTTP door's app (`http_app()`) and the
app's lifespan starts the service (`running()`: every door but HTTP). The HTTP door and Frigate's ZMQ door are made
here, each imported only when the settings or the launch ask for it; neither knows the service beyond what it asks
of it (app/api/deps.py ServiceView, app/frontdoors/served.py Detectors). MLServer's `MLServer` is the model: one object builds the data plane every
protocol shares, and starts the servers around it.

Start: the models load in the background (the doors answer meanwhile: /healthz, a Frigate waiting for its model),
the worker joins its group (a worker listens only once loaded), SIGHUP reloads every model, then each door opens in
the order added. Stop, in reverse: each door closes (HTTP stops accepting and lets its requests finish, within
DRAIN_TIMEOUT_S), the group's line closes, the requests still admitted finish (DRAIN_TIMEOUT_S), then every
interpreter and image thread is closed. A second SIGTERM or SIGINT stops at once: nothing waits for what is in flight.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from app import metrics, processes
from app.core import Core, ImageWork, image_threads
from app.core.faces import Faces
from app.frontdoors import zmq_door
from app.imaging.decoding import reuse_image_buffers
from app.processes.siblings import Siblings, reload_here, reload_others
from app.registry import Registry
from app.settings import Settings

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Door(Protocol):
    """A front door: it opens onto the core, and says whether it serves."""

    async def start(self) -> None:
        """Open (bind, listen); an error here stops the service's start."""

    async def stop(self) -> None:
        """Close: stop taking requests, let those being answered finish (bounded)."""

    def ready(self) -> str | None:
        """None while it serves, else why not (for /readyz)."""

    def report(self) -> dict | None:
        """What it says of itself (for /v1/devices); None: nothing."""


class Doors:
    """The service's doors, by name, in the order they open."""

    def __init__(self) -> None:
        self.doors: dict[str, Door] = {}

    def add(self, name: str, door: Door) -> None:
        if name in self.doors:
            raise ValueError(f"a door named {name!r} is here already")
        self.doors[name] = door

    def problems(self) -> dict[str, str]:
        """Each door that does not serve, and why (for /readyz)."""
        return {name: problem for name, door in self.doors.items() if (problem := door.ready()) is not None}

    def reports(self) -> dict[str, dict]:
        """What each door says of itself (for /v1/devices); doors with nothing to say are left out."""
        return {name: report for name, door in self.doors.items() if (report := door.report()) is not None}

    def force(self) -> None:
        """Each door that can drop what it holds at once does (a second SIGTERM)."""
        for door in self.doors.values():
            force = getattr(door, "force", None)
            if force is not None:
                force()


class Service:
    """Everything the settings ask for, built now; started and stopped in order (`start`, `stop`)."""

    def __init__(self, settings: Settings):
        reuse_image_buffers(settings.image_buffer_blocks, settings.image_buffer_block_bytes)
        self.settings = settings
        self.registry = Registry(settings)
        # model directories are checked now, so a misconfiguration stops the process at once; interpreters load
        # (and warm up) once started, in the background
        self.registry.configure()
        slot = processes.current()  # one of several worker processes (app/processes), or None: alone
        self.siblings = Siblings(slot, self.registry) if slot is not None else None
        self.images = ImageWork(image_threads(settings.image_threads, self.registry.host_cpu),
                                settings.max_image_pixels, nice=settings.compute_nice,
                                max_decoded_pixels=settings.max_decoded_pixels,
                                accept_damaged=settings.accept_damaged_images)
        self.core = Core(self.registry, self.images)
        # the face commands (FACE_DETECTOR, FACE_EMBEDDER): their gallery opened at start, in this process
        self.faces = Faces(settings, self.core, reembeds=slot is None or slot.index == 0)
        metrics.watch(self.registry)  # /metrics reports this registry's state (one per process: the last one)
        self.doors = Doors()
        zmq = zmq_door(settings, self.core, slot is None or slot.index == 0)
        if zmq is not None:
            self.doors.add("zmq", zmq)
        self.state = "built"  # then starting, running, stopping, stopped
        self.forced = False   # a second stop signal: nothing more is waited for
        self._loading: asyncio.Task | None = None
        self._opened: list[Door] = []
        self._hangup = False
        self._http_app = None

    def add_door(self, name: str, door: Door) -> None:
        """One more door, opened after those before it and closed before them."""
        self.doors.add(name, door)

    def http_app(self):
        """The HTTP door's app onto this service (FastAPI: app/api/app.py), made once, on first ask: a service asked
        for none loads no web framework. Another server runs it (gunicorn, uvicorn), or this service (`open_http`).
        A ServeError where the settings' API keys cannot be keys."""
        if self._http_app is None:
            from app.api.app import http_app

            self._http_app = http_app(self)
        return self._http_app

    def open_http(self):
        """python -m app: the HTTP server (uvicorn with our protocol, app/http_server.py), running the HTTP door's
        app, one of this service's doors: the last one opened, the first one closed. Returns it."""
        from app.http_server import ServerDoor

        server = ServerDoor(self.http_app(), self.settings)
        self.add_door("http", server)
        return server

    # -- lifetime ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models in the background, join the worker group (once loaded), take SIGHUP, open every door.
        A door that cannot open stops the start: what was started is stopped, and its error raised."""
        if self.state != "built":
            raise RuntimeError(f"the service is {self.state}: it starts once")
        self.state = "starting"
        try:
            self._loading = asyncio.create_task(asyncio.to_thread(self.registry.load_all))
            if self.siblings is not None:
                await self.siblings.start()  # the others see it loading, and ask it for reloads, from now on
                # a worker listens once loaded: the kernel gives connections only to workers that accept, so the
                # other workers take the requests meanwhile (a restart after a crash fails nothing)
                await asyncio.shield(self._loading)
                processes.slots.mark_loaded()
            self._hangup = reload_on_hangup(self.registry)
            await self.faces.start()  # the gallery, opened in this process (after any fork)
            for door in self.doors.doors.values():
                await door.start()
                self._opened.append(door)
        except BaseException:
            await self.stop()
            raise
        self.state = "running"

    async def stop(self) -> None:
        """Close every door (the last opened first), then let the admitted requests finish (DRAIN_TIMEOUT_S; at once
        after a second stop signal) and close every interpreter and image thread. Once; a later call returns."""
        if self.state in ("stopping", "stopped", "built"):
            return
        self.state = "stopping"
        while self._opened:
            await self._opened.pop().stop()
        if self._hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self.siblings is not None:
            await self.siblings.stop()
        drain_s = 0.0 if self.forced else self.settings.drain_timeout_s
        if not await self.registry.drain(drain_s) and not self.forced:
            log.warning("drain: %d request(s) still in flight after %.1f s; closing anyway",
                        self.registry.active, drain_s)
        if self._loading is not None:  # a load still under way drops what it loads once draining; bounded
            await asyncio.wait({self._loading}, timeout=drain_s)
        await self.faces.stop()
        await asyncio.to_thread(self.registry.close)
        self.images.close()
        self.state = "stopped"

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Service]:
        """The service running for the block: started here and stopped after, unless its owner started it (python
        -m app starts it, then the HTTP server whose app's lifespan this is)."""
        if self.state != "built":
            yield self
            return
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def serve(self) -> None:
        """python -m app: start, serve until SIGTERM or SIGINT, stop. A second signal stops at once."""
        loop = asyncio.get_running_loop()
        asked = asyncio.Event()

        def ask_to_stop() -> None:
            if asked.is_set():
                self.forced = True
                self.doors.force()
            asked.set()

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, ask_to_stop)
        try:
            await self.start()
            await asked.wait()
        finally:
            await self.stop()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    # -- the whole service, as its doors report it ------------------------------------------------------------

    async def reload(self, name: str) -> None:
        """Reload `name` here, then in every other worker of the group (each in place); ReloadIncomplete names the
        workers that did not."""
        await self.core.reload(name)  # here first: its failure is the answer, as with one process
        if self.siblings is not None:
            await reload_others(self.siblings, name)

    def device_reports(self) -> dict[str, dict]:
        """What each available backend plug-in says about itself and its devices, by key. Blocking (a plug-in may
        enumerate devices): off the event loop."""
        return self.registry.reports()


def reload_on_hangup(registry: Registry) -> bool:
    """SIGHUP reloads every model in place, as the admin route reloads one (under gunicorn the master sends it to
    each worker). Where the loop runs in the main thread (a server's, not a test client's): True."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def hangup() -> None:
        log.info("SIGHUP: reloading every model")
        asyncio.ensure_future(reload_here(registry, None))

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)
    return True
