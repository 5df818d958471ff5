"""gunicorn with the service's HTTP limits: uvicorn's gunicorn worker (the `uvicorn-worker` package) running
our protocol.

    gunicorn -c python:app.gunicorn_conf app.main:app                                  # N workers, one port
    gunicorn -k app.gunicorn_worker.LimitedUvicornWorker --workers 1 --bind 127.0.0.1:8000 app.main:app

Settings other than the address come from EDGETPU_SERVE_* as for `python -m app`; the limits reach the
protocol through the app's lifespan (app/http_server.py). Several workers need the group's hooks
(app/gunicorn_conf.py, app/processes/arbiter.py): each worker takes the slot the master gave it and, with
it, its place among the processes claiming the TPUs and its part of the host's limits
(app/processes/slots.py); without the hooks a second worker would open the TPUs the first one holds, so
`--workers N` alone is refused. `--preload` would build the app, its threads and interpreters, in
gunicorn's master before the fork: refused too (app/launch.py).

In a group, a worker listens only once its models are loaded (the others take the requests meanwhile):
until then it tells the master it is alive itself, since uvicorn does so only once serving. HUP reloads
its models in place (the master sends it to every worker: app/processes/arbiter.py).

Extends the worker through its documented hook, CONFIG_KWARGS (uvicorn's Config options), and gunicorn's
Worker.init_process / init_signals; beyond them it relies on the worker's `config` and on `sockets` being read
only once the app's lifespan has started, which tests/test_gunicorn_worker.py names and checks. Needs
`pip install edgetpu-serve[gunicorn]` (its range in pyproject.toml).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from uvicorn_worker import UvicornWorker

from app import launch, processes
from app.http_server import LimitedHttpToolsProtocol
from app.processes.arbiter import listeners


class LimitedUvicornWorker(UvicornWorker):
    """uvicorn's worker with our HTTP protocol, the service's shutdown drain, and its slot in the group."""

    CONFIG_KWARGS: dict[str, Any] = {
        "loop": "auto",
        "http": LimitedHttpToolsProtocol,
        "limit_concurrency": None,  # ours is per connection, at connect, in JSON
    }

    def init_process(self) -> None:
        slot = getattr(self, "service_slot", None)  # given by the group's master (app/processes/arbiter.py)
        if slot is None and self.cfg.workers != 1:
            launch.refuse(f"gunicorn was asked for {self.cfg.workers} workers without the service's configuration, "
                          "so each would open every TPU. Start them with `gunicorn -c python:app.gunicorn_conf "
                          f"--workers {self.cfg.workers} app.main:app` (each worker then takes its share of the "
                          "TPUs), or `EDGETPU_SERVE_PROCESSES=N python -m app`.")
        settings = launch.environment_settings()
        self.config.timeout_graceful_shutdown = settings.drain_timeout_s
        self.config.access_log = bool(self.cfg.accesslog)
        if slot is not None:
            loaded = processes.slots.loaded
            threading.Thread(target=self._alive_until, args=(loaded,), name="edgetpu-serve-heartbeat",
                             daemon=True).start()
            processes.join(slot, heartbeat=self.notify)
            self._listen_once_loaded()
        launch.mark_protocol_in_use()  # this process runs it: the app's lifespan may start
        super().init_process()

    def _listen_once_loaded(self) -> None:
        """This worker's copies of the master's reservations closed (they never listen); its own listening sockets
        made once its models are loaded (app/processes/arbiter.py listeners), into the list that uvicorn reads after
        the app's lifespan has started (`self.sockets`: tests/test_gunicorn_worker.py). Never before: a socket
        listening while the models load would hold the connections the kernel gave it until then."""
        for reservation in self.sockets:
            reservation.close()
        self.sockets.clear()
        processes.slots.when_loaded(lambda: self.sockets.extend(listeners(self.cfg)))

    def init_signals(self) -> None:
        super().init_signals()
        # HUP reloads the models once the app runs (its lifespan installs that); until then it is ignored,
        # rather than ending the process as it would by default
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _alive_until(self, done: threading.Event) -> None:
        """Tell the master this worker is alive while its models load (it serves, and uvicorn tells, after)."""
        interval = max(0.5, self.timeout / 4)
        while not done.wait(interval):
            self.notify()
