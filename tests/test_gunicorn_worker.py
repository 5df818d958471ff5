"""What the service relies on in gunicorn and uvicorn-worker beyond their documented hooks, by name: app/gunicorn_worker.py
(uvicorn's gunicorn worker running our protocol) and the master's signals in app/processes/arbiter.py. gunicorn and
uvicorn-worker are pinned to the versions this was read from (pyproject.toml): a release that changes one of these
fails here first, by name. Their behaviour is tested through real launches (tests/test_http_server.py,
tests/test_launch.py, tests/test_processes.py)."""

from __future__ import annotations

import inspect
import os

import gunicorn
import gunicorn.arbiter
import gunicorn.workers.base
import uvicorn
import uvicorn_worker
from gunicorn.config import Config as GunicornConfig
from gunicorn.glogging import Logger

from app.gunicorn_worker import LimitedUvicornWorker
from app.http_server import LimitedHttpToolsProtocol
from tests.contracts import changed_methods

# gunicorn's Worker, as a worker class extends it (documented for custom workers)
WORKER_METHODS = {"init_process": "", "init_signals": "", "notify": ""}
WORKER_ATTRIBUTES = ("sockets", "cfg", "log", "timeout")
# uvicorn-worker's UvicornWorker: CONFIG_KWARGS is its documented hook (uvicorn Config options); beyond it, `config`,
# the uvicorn Config its __init__ builds (the drain is set on it), and `_serve` (private), which hands `self.sockets`,
# the list itself, to uvicorn's Server.serve, which reads it only once the app's lifespan has started
UVICORN_WORKER_SERVE = "await server.serve(sockets=self.sockets)"
# gunicorn's master (app/processes/arbiter.py): HUP, USR2, TTIN and TTOU handled by methods replaced on the
# instance, which its loop finds by name; kill_workers, WORKERS and num_workers read or set; its LISTENERS set to
# the master's reservations in on_starting, so that it makes listening sockets of its own neither at its start
# (where LISTENERS is empty) nor at each worker's fork (reuse_port, set false)
ARBITER_METHODS = {"handle_hup": "", "handle_usr2": "", "handle_ttin": "", "handle_ttou": "", "kill_workers": "sig"}
ARBITER_DISPATCH = 'getattr(self, "handle_%s" % signame'
ARBITER_START_ORDER = ("self.cfg.on_starting(self)", "if not self.LISTENERS:", "sock.create_sockets(")
ARBITER_FORK_SOCKETS = "if self.cfg.reuse_port and"


def test_what_the_worker_relies_on_in_gunicorn_and_uvicorn_worker_is_there():
    changed = changed_methods(gunicorn.workers.base.Worker, WORKER_METHODS)
    cfg = GunicornConfig()
    sockets: list = []
    worker = LimitedUvicornWorker(0, os.getpid(), sockets, None, 30, cfg, Logger(cfg))
    try:
        changed += [f"Worker().{name} is gone" for name in WORKER_ATTRIBUTES if not hasattr(worker, name)]
        if worker.sockets is not sockets:
            changed.append("Worker().sockets is no longer the list the master gave")
        if not isinstance(getattr(worker, "config", None), uvicorn.Config):
            changed.append("UvicornWorker().config is no longer the uvicorn Config it runs")
        elif worker.config.http is not LimitedHttpToolsProtocol or worker.config.limit_concurrency is not None:
            changed.append("UvicornWorker no longer builds its Config from CONFIG_KWARGS")
    finally:
        worker.tmp.close()
    serve = getattr(uvicorn_worker.UvicornWorker, "_serve", None)
    if serve is None or UVICORN_WORKER_SERVE not in inspect.getsource(serve):
        changed.append(f"UvicornWorker._serve no longer does `{UVICORN_WORKER_SERVE}`")
    startup = inspect.getsource(uvicorn.Server.startup).partition(":\n")[2]  # its body
    if not 0 <= startup.find("await self.lifespan.startup()") < startup.find("sockets"):
        changed.append("uvicorn.Server.startup no longer starts the lifespan before it reads the sockets")
    assert not changed, (f"gunicorn {gunicorn.__version__} / uvicorn-worker / uvicorn {uvicorn.__version__} changed "
                         "what app/gunicorn_worker.py relies on:\n  " + "\n  ".join(changed))


def test_what_the_master_relies_on_in_gunicorn_is_there():
    arbiter = gunicorn.arbiter.Arbiter
    changed = changed_methods(arbiter, ARBITER_METHODS)
    if not isinstance(getattr(arbiter, "WORKERS", None), dict):
        changed.append("Arbiter.WORKERS is gone")
    if not isinstance(getattr(arbiter, "num_workers", None), property):
        changed.append("Arbiter.num_workers is no longer a settable property")
    if ARBITER_DISPATCH not in inspect.getsource(arbiter.run):
        changed.append(f"Arbiter.run no longer finds a signal's handler by name (`{ARBITER_DISPATCH}`)")
    if not isinstance(getattr(arbiter, "LISTENERS", None), list):
        changed.append("Arbiter.LISTENERS is gone")
    start = inspect.getsource(arbiter.start)
    places = [start.find(line) for line in ARBITER_START_ORDER]
    if not 0 <= places[0] < places[1] < places[2]:
        changed.append("Arbiter.start no longer makes its listening sockets only where on_starting set none "
                       f"({' ... '.join(ARBITER_START_ORDER)})")
    spawn = inspect.getsource(arbiter.spawn_worker)
    if spawn.count("create_sockets(") != 1 or ARBITER_FORK_SOCKETS not in spawn:
        changed.append(f"Arbiter.spawn_worker no longer makes a worker's sockets only under reuse_port "
                       f"(`{ARBITER_FORK_SOCKETS}`)")
    assert not changed, (f"gunicorn {gunicorn.__version__} changed what app/processes/arbiter.py relies on:\n  "
                         + "\n  ".join(changed))
