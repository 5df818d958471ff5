"""gunicorn with the service's HTTP limits: uvicorn's gunicorn worker (the `uvicorn-worker` package) running
our protocol, one process per host.

    gunicorn -k app.gunicorn_worker.LimitedUvicornWorker --workers 1 --bind 127.0.0.1:8000 app.main:app

Settings other than the address come from EDGETPU_SERVE_* as for `python -m app`; the limits reach the
protocol through the app's lifespan (app/http_server.py). One worker: the connection cap, the body budget
and the Edge TPUs belong to one process, so N workers would hold N times the limits and fight over the
devices (scale out with replicas instead). `--preload` would build the app, its threads and interpreters,
in gunicorn's arbiter before the fork: refused too (app/launch.py's message).

Extends the worker through its documented hook, CONFIG_KWARGS (uvicorn's Config options), and gunicorn's
Worker.load_wsgi; needs `pip install edgetpu-serve[gunicorn]` (pinned in pyproject.toml).
"""

from __future__ import annotations

from typing import Any

from uvicorn_worker import UvicornWorker

from app import launch
from app.http_server import LimitedHttpToolsProtocol


class LimitedUvicornWorker(UvicornWorker):
    """uvicorn's worker with our HTTP protocol and the service's shutdown drain."""

    CONFIG_KWARGS: dict[str, Any] = {
        "loop": "auto",
        "http": LimitedHttpToolsProtocol,
        "limit_concurrency": None,  # ours is per connection, at connect, in JSON
    }

    def init_process(self) -> None:
        if self.cfg.workers != 1:
            launch.refuse(f"gunicorn was asked for {self.cfg.workers} workers; the service runs as one process "
                          "per host (the connection cap, the body budget and the Edge TPUs are per process).")
        self.config.timeout_graceful_shutdown = launch.environment_settings().drain_timeout_s
        launch.mark_protocol_in_use()  # this process runs it: the app's lifespan may start
        super().init_process()
