"""The workers' line to each other, so that any one of them answers for the whole service.

Each worker answers on a Unix socket of its own in the group's directory (`worker-<k>.sock`, mode 0700
directory), one JSON request line, one JSON answer line:

  {"op": "status"}                 its slot, pid, readiness, each model's state and version, its devices
  {"op": "devices"}                its plug-ins' device reports (GET /v1/devices)
  {"op": "state"}                  its state gauges (app/metrics.py StateCollector), read now
  {"op": "reload", "model": NAME}  reload NAME (null: every model) here, in place; answers when done

Asked at the moment a client asks (a scrape, a readiness probe, GET /v1/devices, an admin reload), so
nothing is kept in step in the background and nothing is stale; a worker that does not answer within
the timeout (starting, hung, gone) is reported as not answering. The answers are merged by
app/processes/views.py (readiness, devices) and app/metrics.py (gauges).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from app import metrics
from app.errors import ServeError
from app.processes.slots import Slot
from app.registry import Registry

log = logging.getLogger(__name__)

# Fixed, not settings: bounds on the workers' talk among themselves, far from anything a deployment changes.
ASK_TIMEOUT_S = 2.0      # status, devices, gauges: a live worker answers in milliseconds
RELOAD_TIMEOUT_S = 120.0  # a reload loads and checks every file again, and makes every interpreter anew
MAX_LINE = 16 * 1024 * 1024  # a device report of many models on many TPUs fits many times over


class ReloadIncomplete(ServeError):
    """The worker that took the admin request reloaded the model; another one did not (it keeps serving
    its own version, and says why in /readyz)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Siblings:
    """This worker's socket, and its questions to the other workers of the group."""

    def __init__(self, slot: Slot, registry: Registry):
        self.slot = slot
        self.registry = registry
        self._server: asyncio.AbstractServer | None = None

    @property
    def processes(self) -> int:
        return self.slot.count

    async def start(self) -> None:
        path = self.slot.socket_path()
        path.unlink(missing_ok=True)  # the socket of this slot's previous holder, dead
        self._server = await asyncio.start_unix_server(self._connection, path=str(path), limit=MAX_LINE)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            self.slot.socket_path().unlink(missing_ok=True)

    # -- answering -------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(await reader.readline())
            answer = await self.answer(request)
        except Exception as e:  # a bad line or a failure here: the asker gets it, this worker goes on
            log.exception("answering a sibling")
            answer = {"error": f"{type(e).__name__}: {e}"}
        try:
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except OSError:  # the asker gave up (its timeout)
            pass
        finally:
            writer.close()

    async def answer(self, request: dict) -> dict:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "devices":
            return {"backends": await asyncio.to_thread(self.registry.reports)}
        if op == "state":
            return {"families": await asyncio.to_thread(metrics.state_families, self.registry)}
        if op == "reload":
            return await reload_here(self.registry, request.get("model"))
        return {"error": f"unknown request {op!r}"}

    def status(self) -> dict:
        models = {}
        for name in self.registry.names():
            status = self.registry.status(name)
            version = self.registry.serving(name)
            models[name] = {"state": status.state, "error": status.error, "since": status.since,
                            "version": version.number if version else None}
        registry = self.registry
        devices = sorted({device for key in registry.settings.backends  # the devices it serves on (its TPUs)
                          for device in registry.devices.offered(registry.plugins[key])})
        return {"slot": self.slot.index, "pid": os.getpid(), "ready": registry.ready(), "models": models,
                "devices": devices}

    # -- asking ----------------------------------------------------------------------------------

    async def ask(self, op: str, timeout_s: float = ASK_TIMEOUT_S, **fields: Any) -> dict[int, dict | None]:
        """Every other worker's answer by slot, None for one that did not answer in time."""
        others = self.slot.others()
        answers = await asyncio.gather(*(self._ask_one(i, {"op": op, **fields}, timeout_s) for i in others))
        return dict(zip(others, answers))

    async def everyone(self, op: str, timeout_s: float = ASK_TIMEOUT_S) -> dict[int, dict | None]:
        """Every worker's answer by slot, this one's included (asked directly, not through its socket)."""
        answers, own = await asyncio.gather(self.ask(op, timeout_s), self.answer({"op": op}))
        return dict(sorted({**answers, self.slot.index: own}.items()))

    async def _ask_one(self, index: int, request: dict, timeout_s: float) -> dict | None:
        async def exchange() -> dict:
            reader, writer = await asyncio.open_unix_connection(str(self.slot.socket_path(index)), limit=MAX_LINE)
            try:
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                return json.loads(await reader.readline())
            finally:
                writer.close()

        try:
            return await asyncio.wait_for(exchange(), timeout_s)
        except (OSError, ValueError, asyncio.TimeoutError) as e:  # starting, gone, or too slow
            log.debug("worker %d did not answer %s: %s", index, request.get("op"), e)
            return None


async def reload_here(registry: Registry, model: str | None) -> dict:
    """Reload `model` (None: every model) in this process, in place (the registry's reload: a new version
    beside the old one, which serves until its last request ends). The first failure, if any."""
    names = registry.names() if model is None else [model]
    problem = None
    for name in names:
        try:
            await asyncio.to_thread(registry.reload, name)
        except ServeError as e:  # logged by the registry; the version already loaded keeps serving
            problem = problem or {"error": f"{name}: {e}", "status": e.status}
    return {"ok": problem is None, **(problem or {})}


async def reload_others(siblings: Siblings, name: str) -> None:
    """The admin reload, once this worker has reloaded (its failure is the answer, as with one process): every
    other worker, each in place. Raises ReloadIncomplete naming the workers that did not reload."""
    answers = await siblings.ask("reload", RELOAD_TIMEOUT_S, model=name)
    failed = {i: a for i, a in answers.items() if a is None or not a.get("ok")}
    if failed:
        status = next((a["status"] for a in failed.values() if a is not None and "status" in a), 503)
        raise ReloadIncomplete(
            f"reloaded in {len(answers) + 1 - len(failed)} of {siblings.processes} worker processes; "
            + "; ".join(f"worker {i}: " + ("did not answer (gone, or starting)" if a is None else a.get("error", "?"))
                        for i, a in sorted(failed.items())), status)
