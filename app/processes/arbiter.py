"""gunicorn's master for a host with many Edge TPUs: slots for its workers, HUP as an in-place reload.

Through gunicorn's documented server hooks (a config module: app/gunicorn_conf.py, or `python -m app`'s
own application: app/gunicorn_app.py), with one exception said below:

  on_starting   the address reserved (each worker listens on a socket of its own, SO_REUSEPORT, once its
                models are loaded); the group's directory (0700): each worker's socket and slot lock, and
                the metrics files (PROMETHEUS_MULTIPROC_DIR); removed on exit
  pre_fork      the new worker's slot: the lowest one no live worker holds, so a worker that replaces a
                dead one takes its slot, and its TPUs (app/processes/slots.py)
  child_exit    a dead worker's live gauges dropped from the metrics files (its counters stay: its
                requests were answered)
  nworkers_changed  the worker count stays what it started as: the TPUs are split by it

gunicorn's own HUP starts a new set of workers and then stops the old ones: the new ones would open
TPUs the old ones still hold. Here HUP reloads the models in every worker instead, in place (each
worker's registry loads a new version beside the one serving, swaps, and retires the old one when its
last request ends), so no request fails and no TPU changes hands. USR2 (a new master beside the old)
and TTIN/TTOU are refused for the same reason. That replaces the master's `handle_hup`, `handle_usr2`,
`handle_ttin` and `handle_ttou` on the instance: the one place this reaches past the hooks, named by
tests/test_gunicorn_worker.py and tested (tests/test_processes.py). gunicorn's control socket, whose commands
bypass the signals, is off.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any

from app.processes.slots import Slot, metrics_dir
from app.settings import Settings

log = logging.getLogger(__name__)

WORKER_CLASS = "app.gunicorn_worker.LimitedUvicornWorker"
GROUP = "edgetpu_serve_group"  # the master's attribute holding the group
# Fixed: how long the master's check that nothing answers on its port waits for a connection (a local
# server accepts at once; one that does not within this is not serving there).
ANSWERING_S = 0.5


class Group:
    """What the master knows of its workers' group: its directory and its fixed size."""

    def __init__(self, run_dir: Path, count: int):
        self.run_dir = run_dir
        self.count = count
        self.guards: list[socket.socket] = []  # the master's hold on its addresses (reserve)

    def slot_for(self, live_slots: set[int]) -> Slot:
        free = [i for i in range(self.count) if i not in live_slots]
        if not free:
            raise RuntimeError(f"no free slot among {self.count}: a worker beyond the group's size")
        return Slot(free[0], self.count, self.run_dir)


def bind_address(settings: Settings) -> str:
    return f"[{settings.host}]:{settings.port}" if ":" in settings.host else f"{settings.host}:{settings.port}"


def options(settings: Settings, workers: int) -> dict[str, Any]:
    """gunicorn's settings for the service: our worker, the group's hooks, the drain and then the closing of the
    interpreters as the graceful timeout (beyond it the master kills the worker)."""
    return {
        "bind": [bind_address(settings)],
        "workers": workers,
        "worker_class": WORKER_CLASS,
        "graceful_timeout": math.ceil(settings.drain_timeout_s + settings.close_timeout_s),
        "loglevel": settings.log_level,
        "control_socket_disable": True,
        # each worker its own listening socket: the kernel spreads connections over them by a hash of their
        # addresses, where one shared socket goes to whichever worker wakes first (8 connections opened
        # together: all 8 to one worker in 11 tries of 12, measured); each listens once loaded
        "reuse_port": True,
        "on_starting": on_starting,
        "pre_fork": pre_fork,
        "child_exit": child_exit,
        "nworkers_changed": nworkers_changed,
        "on_exit": on_exit,
    }


def group_of(server) -> Group | None:
    return getattr(server, GROUP, None)


# ---- the hooks -------------------------------------------------------------------------------

def on_starting(server) -> None:
    guards = [reserve(server, address) for address in server.cfg.address if isinstance(address, tuple)]
    run_dir = Path(tempfile.mkdtemp(prefix="edgetpu-serve-"))  # 0700
    metrics_dir(run_dir).mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir(run_dir))  # inherited by every worker
    master = os.getpid()
    # removed on any exit of the master (gunicorn's on_exit misses one after an error in its loop), never
    # by a worker, which inherits the handler
    atexit.register(lambda: os.getpid() == master and shutil.rmtree(run_dir, ignore_errors=True))
    group = Group(run_dir, server.cfg.workers)
    group.guards = guards
    setattr(server, GROUP, group)
    server.handle_hup = lambda: reload_workers(server)
    server.handle_usr2 = lambda: refuse(server, "USR2 (a second master with its own workers)")
    server.handle_ttin = lambda: refuse(server, "TTIN (one worker more)")
    server.handle_ttou = lambda: refuse(server, "TTOU (one worker less)")
    server.log.info("edgetpu-serve: %d worker processes, each with its share of the TPUs; group files in %s",
                    server.cfg.workers, run_dir)


def reserve(server, address: tuple[str, int]) -> socket.socket:
    """The master's hold on a TCP address its workers will listen on, each with its own socket
    (SO_REUSEPORT): a socket bound with SO_REUSEPORT but not listening, so that another program cannot bind
    the port meanwhile, and none answers on it already (a second instance of the service, whose own
    reuse_port sockets would otherwise share the port with ours). Port 0: the port the kernel gives it, which
    the workers then take (gunicorn's `bind`). RuntimeError, which gunicorn prints, where the port is taken."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(ANSWERING_S)
            target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
            if probe.connect_ex((target, port)) == 0:
                raise RuntimeError(f"{host}:{port} is in use: something answers on it already")
    guard = socket.socket(family, socket.SOCK_STREAM)
    guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past connections in TIME_WAIT
    guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        guard.bind((host, port))
    except OSError as e:
        guard.close()
        raise RuntimeError(f"cannot bind {host}:{port}: {e}") from None
    if not port:
        port = guard.getsockname()[1]
        server.cfg.set("bind", [f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"])
        server.log.info("edgetpu-serve: port 0: listening on %d", port)
    return guard


def pre_fork(server, worker) -> None:
    group = group_of(server)
    live = {w.service_slot.index for w in server.WORKERS.values() if getattr(w, "service_slot", None)}
    worker.service_slot = group.slot_for(live)


def child_exit(server, worker) -> None:
    from app import metrics

    metrics.process_gone(worker.pid, metrics_dir(group_of(server).run_dir))


def nworkers_changed(server, new_value: int, old_value: int | None) -> None:
    group = group_of(server)
    if group is not None and new_value != group.count:
        server.log.error("edgetpu-serve: the worker count stays %d: the TPUs are split among the workers by it "
                         "(restart the service with another count)", group.count)
        server.num_workers = group.count


def on_exit(server) -> None:
    group = group_of(server)
    if group is not None:
        for guard in group.guards:
            guard.close()
        shutil.rmtree(group.run_dir, ignore_errors=True)


# ---- the master's signals ----------------------------------------------------------------------

def reload_workers(server) -> None:
    """HUP: every worker reloads its models in place (app/gunicorn_worker.py, app/processes/siblings.py)."""
    server.log.info("edgetpu-serve: HUP: every worker reloads its models, in place")
    server.kill_workers(signal.SIGHUP)


def refuse(server, what: str) -> None:
    server.log.error("edgetpu-serve: %s refused: the TPUs are split among a fixed set of workers, and a new "
                     "worker may not open a TPU an old one holds. HUP reloads the models; to change the code or "
                     "the worker count, restart the service", what)
