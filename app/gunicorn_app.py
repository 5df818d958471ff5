"""`python -m app` with several processes: gunicorn's master in this process, with the options that
`gunicorn -c python:app.gunicorn_conf` gets (app/processes/arbiter.py), and the service's modules
imported in the master before it forks its workers."""

from __future__ import annotations

from app.processes.arbiter import options
from app.settings import Settings


def import_the_service() -> None:
    """Import the service's modules in the master, before the fork, without building the app (as --preload
    would: its threads and interpreters): every worker, a replacement after a crash too, starts with them
    imported (a second or more of imports saved), and shares their memory until it writes to it. Nothing
    they import starts a thread or opens a device; the metrics take their multiprocess values in the worker
    (app/metrics.py use_multiprocess)."""
    import app.api.app  # noqa: F401  (the HTTP door, which the service imports only when asked for it)
    import app.main  # noqa: F401


def serve(settings: Settings, workers: int) -> int:
    """`python -m app` with EDGETPU_SERVE_PROCESSES > 1: gunicorn's master in this process (plug-ins
    registered before, by a benchmark say, are in every worker: they are forked from here)."""
    from gunicorn.app.base import BaseApplication

    import_the_service()

    class Service(BaseApplication):
        def load_config(self) -> None:
            for key, value in options(settings, workers).items():
                self.cfg.set(key, value)

        def load(self):
            from app import launch
            from app.main import create_app

            return launch.app_for_server("app.main:app", create_app)

    Service().run()
    return 0
