"""app/service.py: everything built from the settings, started and stopped in order, doors beside each other.

Doors here are doubles that write down what they saw (named as doubles); the HTTP door and Frigate's ZMQ door run for
real in tests/test_lifecycle.py, tests/test_launch.py, tests/test_http_server.py and tests/test_zmq_door.py."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import ShuttingDown
from app.service import Service
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS

LOAD_S = 60


class RecordingDoor:
    """A door double: what the service asked of it, and what it saw of the service then."""

    def __init__(self, name: str, events: list, service: Service | None = None, fails: bool = False):
        self.name, self.events, self.service, self.fails = name, events, service, fails

    async def start(self) -> None:
        state = self.service.state if self.service else None
        self.events.append((self.name, "start", state))
        if self.fails:
            raise OSError(f"{self.name}: address in use")

    async def stop(self) -> None:
        draining = self.service.registry.draining if self.service else None
        self.events.append((self.name, "stop", draining))

    def ready(self) -> str | None:
        return None

    def report(self) -> dict | None:
        return {"door": self.name}


def service(**settings) -> Service:
    return Service(Settings(model_dir=MODELS, models=[DEFAULT_MODEL], backends=["cpu"], workers=1,
                            warmup_at_start=False, **settings))


def test_the_doors_open_in_order_once_the_models_load_and_close_in_reverse_before_the_drain():
    events: list = []
    built = service()
    for name in ("first", "second"):
        built.add_door(name, RecordingDoor(name, events, built))

    async def scenario():
        async with built.running():
            assert built.state == "running"
            assert await built.core.settled(LOAD_S)
            assert built.core.ready() and built.doors.reports() == {"first": {"door": "first"},
                                                                    "second": {"door": "second"}}
        return built.state

    assert asyncio.run(scenario()) == "stopped"
    # opened while starting, in order; closed in reverse, each before the drain began
    assert events == [("first", "start", "starting"), ("second", "start", "starting"),
                      ("second", "stop", False), ("first", "stop", False)]
    with pytest.raises(ShuttingDown):  # closed: no request gets a model any more
        built.registry.ticket(DEFAULT_MODEL)


def test_a_door_that_cannot_open_stops_the_start_and_what_was_started_is_stopped():
    events: list = []
    built = service()
    built.add_door("opens", RecordingDoor("opens", events, built))
    built.add_door("fails", RecordingDoor("fails", events, built, fails=True))
    built.add_door("never", RecordingDoor("never", events, built))

    async def scenario():
        with pytest.raises(OSError, match="address in use"):
            await built.start()

    asyncio.run(scenario())
    assert events == [("opens", "start", "starting"), ("fails", "start", "starting"), ("opens", "stop", False)]
    assert built.state == "stopped"


def test_a_service_its_owner_started_is_neither_started_nor_stopped_by_the_lifespan_it_runs_under():
    """python -m app starts the service, then the HTTP server whose app's lifespan enters `running()` again."""
    events: list = []
    built = service()
    built.add_door("door", RecordingDoor("door", events, built))

    async def scenario():
        await built.start()
        async with built.running():
            pass
        states = [built.state]
        await built.stop()
        await built.stop()  # once: a second call returns
        return states

    assert asyncio.run(scenario()) == ["running"]
    assert events == [("door", "start", "starting"), ("door", "stop", False)]


def test_a_service_starts_once():
    built = service()

    async def scenario():
        await built.start()
        try:
            with pytest.raises(RuntimeError, match="starts once"):
                await built.start()
        finally:
            await built.stop()

    asyncio.run(scenario())


def test_the_settings_ask_for_the_zmq_door_and_the_http_door_is_made_on_first_ask():
    built = service(zmq_endpoint="tcp://127.0.0.1:5555")
    assert list(built.doors.doors) == ["zmq"]
    app = built.http_app()
    assert built.http_app() is app  # one app a service
    assert list(built.doors.doors) == ["zmq"]  # run by another server: not one of the service's doors
    server = built.open_http()
    assert list(built.doors.doors) == ["zmq", "http"] and server.report() is None
    asyncio.run(_close(built))


async def _close(built: Service) -> None:
    built.images.close()
    await asyncio.to_thread(built.registry.close)
