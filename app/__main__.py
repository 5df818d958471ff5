"""python -m app: serve with the settings from the environment (EDGETPU_SERVE_*).

One process (the Service, app/service.py, its HTTP server one of its doors), or, where EDGETPU_SERVE_PROCESSES asks
for more (auto: more than one TPU found), that many worker processes on the one port under gunicorn, each with its own
share of the TPUs (app/processes).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys

from app.errors import ServeError
from app.launch import SettingsRefused, settings_from_environment
from app.memory import tune_malloc
from app.processes.inventory import process_count
from app.settings import Settings


log = logging.getLogger("app")


def main() -> int:
    try:
        settings = settings_from_environment()
    except SettingsRefused as e:
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    processes = process_count(settings)
    if processes > 1 and not gunicorn_installed():
        if settings.processes != "auto":
            print(f"edgetpu-serve: cannot start: {processes} processes need gunicorn. Fix: pip install "
                  "'edgetpu-serve[gunicorn]', or EDGETPU_SERVE_PROCESSES=1", file=sys.stderr)
            return 2
        log.warning("%d TPUs, but one process: gunicorn, which runs several, is not installed "
                    "(pip install 'edgetpu-serve[gunicorn]')", processes)
        processes = 1
    if processes > 1:
        from app.gunicorn_app import serve as serve_processes

        problem = gallery_problem(settings)
        if problem is not None:
            print(f"edgetpu-serve: cannot start: {problem}", file=sys.stderr)
            return 2
        return serve_processes(settings, processes)
    return serve(settings)


def serve(settings: Settings) -> int:
    """One process: the Service, its HTTP server the last door it opens; until SIGTERM or SIGINT."""
    from app.http_server import ServerFailed
    from app.service import Service

    if settings.tune_malloc and not tune_malloc():
        log.info("not glibc: malloc left as it is")
    try:
        service = Service(settings)
        server = service.open_http()
    except ServeError as e:
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=server.loop_factory()) as runner:  # uvloop where installed, as uvicorn's
            runner.run(service.serve())
    except ServerFailed as e:
        return e.status
    except ServeError as e:  # what the start found (a FACE_DB that holds another file): said in one line
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr)
        return 2
    return 0


def gallery_problem(settings: Settings) -> str | None:
    """A face gallery the workers could not open, found before they fork (each would stop the group with a
    traceback): opened here and closed again, so no worker inherits it. None where no face models are set."""
    if settings.face_detector is None or settings.face_embedder is None:
        return None
    from app.faces.gallery import Gallery
    from app.faces.location import default_gallery_path

    try:
        Gallery(settings.face_db or default_gallery_path()).close()
    except ServeError as e:
        return str(e)
    return None


def gunicorn_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("gunicorn", "uvicorn_worker"))


if __name__ == "__main__":
    sys.exit(main())
