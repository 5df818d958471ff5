"""gunicorn's configuration for the service: several workers on one port, each with its own TPUs.

    gunicorn -c python:app.gunicorn_conf app.main:app                  # EDGETPU_SERVE_PROCESSES workers
    gunicorn -c python:app.gunicorn_conf --workers 4 app.main:app      # or as many as --workers says

Our worker (the service's HTTP limits), the group's hooks (app/processes/arbiter.py: slots kept across
restarts, HUP reloads in place), the address from EDGETPU_SERVE_HOST/PORT (`--bind` wins), the drain as
the graceful timeout. Without --workers, EDGETPU_SERVE_PROCESSES says how many (auto: one per TPU found,
counted in a child process). `python -m app` starts the same when it has more than one process to run.
"""

from app.gunicorn_app import import_the_service
from app.launch import environment_settings
from app.processes.arbiter import options
from app.processes.inventory import process_count

_settings = environment_settings()
globals().update(options(_settings, process_count(_settings)))
import_the_service()
