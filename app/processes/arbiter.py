"""gunicorn's master for a host with many Edge TPUs: slots for its workers, HUP as an in-place reload.

Through gunicorn's documented server hooks (a config module: app/gunicorn_conf.py, or `python -m app`'s
own application: app/gunicorn_app.py), with two exceptions said below:

  on_starting   the address reserved: the master's listeners are its reservations (bound, never listening),
                so that gunicorn makes no listening socket of its own; each worker listens on a socket of its
                own (SO_REUSEPORT, `listeners`) once its models are loaded; the group's directory (0700): each
                worker's socket and slot lock, and the metrics files (PROMETHEUS_MULTIPROC_DIR); removed on exit
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
`handle_ttin` and `handle_ttou` on the instance. The other place this reaches past the hooks is the master's
`LISTENERS`, set to its reservations: gunicorn makes listening sockets only where none are set, and its own
`reuse_port` would make each worker's at its fork, listening at once, so that a worker still loading (a
replacement, after a crash) would queue connections that its first step then reset by closing that socket
(measured under load: 4 requests failed for 3 clients). Both are named by tests/test_gunicorn_worker.py and
tested (tests/test_processes.py). gunicorn's control socket, whose commands bypass the signals, is off.
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
        # gunicorn makes no listening socket: each worker makes its own once loaded (`listeners`, SO_REUSEPORT),
        # the kernel spreading connections over them by a hash of their addresses, where one shared socket goes
        # to whichever worker wakes first (8 connections opened one after another: all 8 to one worker in 11
        # tries of 12, measured again for issue 42; by the hash, 4 to 7 of 8)
        "reuse_port": False,
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
    others = [address for address in server.cfg.address if not isinstance(address, tuple)]
    if others:
        raise RuntimeError(f"cannot bind {others}: the worker processes listen on TCP addresses only, each on a "
                           "socket of its own once its models are loaded (--bind HOST:PORT)")
    server.cfg.set("reuse_port", False)  # whatever the command line said: see the module's docstring
    guards = [reserve(server, address) for address in server.cfg.address]
    server.LISTENERS = [HeldAddress(guard) for guard in guards]
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
    queued = {"1": "moved to another worker (net.ipv4.tcp_migrate_req=1)",
              "0": "reset (net.ipv4.tcp_migrate_req=1 would move them to another worker: docs/launch.md)"}
    server.log.info("edgetpu-serve: a killed worker fails the requests it holds; the connections queued on its "
                    "socket are %s", queued.get(migrates_queued_connections(), "reset"))


def migrates_queued_connections() -> str | None:
    """net.ipv4.tcp_migrate_req (Linux 5.14+, per network namespace): "1" where the kernel moves the connections
    queued on a closing listening socket to another of its SO_REUSEPORT group; None where there is no such setting."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_migrate_req").read_text().strip()
    except OSError:
        return None


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


class HeldAddress:
    """The master's hold on an address, as gunicorn's listeners list holds it (gunicorn logs it, hands it to each
    worker, which closes its copy, and closes it at the end): a socket bound with SO_REUSEPORT that never
    listens, so that gunicorn makes no listening socket of its own."""

    def __init__(self, guard: socket.socket):
        self.guard = guard

    def __str__(self) -> str:
        host, port = self.guard.getsockname()[:2]
        return f"http://{host}:{port} (each worker once its models are loaded)"

    def fileno(self) -> int:
        return self.guard.fileno()

    def getsockname(self):
        return self.guard.getsockname()

    def get_backlog(self) -> int:
        return -1  # gunicorn's "not known": each worker's socket has its own line

    def close(self) -> None:
        self.guard.close()


def listeners(cfg) -> list[socket.socket]:
    """A worker's own listening sockets, one per address of gunicorn's `bind`, made once its models are loaded:
    SO_REUSEPORT, so that the kernel spreads new connections over the workers listening; gunicorn's backlog."""
    made = []
    for host, port in cfg.address:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((host, port))
        listener.listen(cfg.backlog)
        listener.setblocking(False)
        made.append(listener)
    return made


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
            guard.close()  # gunicorn closed them already, as its listeners, when it stopped the workers
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
