"""Several processes behind one port, each with its own TPUs, seen from outside as one service.

One process's event loop tops out near 1,000-1,600 requests a second (it holds the GIL 0.5-0.9 ms per
request), whatever the TPU count; the same code as several processes scales almost linearly. gunicorn
is the process manager (a master, workers, restart of a dead worker); this package adds what a host
with many Edge TPUs needs of it:

  slots.py     a worker's slot k of N, kept by its replacement; its place among the processes sharing
               the TPUs (each claims the TPUs it opens, a lock per TPU in the group's directory, so no
               TPU is opened by two processes: the Edge TPU plug-in's claims); the per-host limits
               split among the workers; `auto` process count
  arbiter.py   gunicorn's side: slots given out in the master, HUP as an in-place reload of every
               worker, the worker count fixed (the TPUs are split by it); the options that
               app/gunicorn_conf.py and `python -m app` (app/gunicorn_app.py) give gunicorn
  siblings.py  the workers' line to each other (a Unix socket each): every worker's readiness, devices,
               gauges and reloads, so /readyz, /v1/devices, /metrics and the admin reload speak for all
  views.py     their answers merged into the service's: readiness, devices
  inventory.py the TPUs and pipeline lengths a host has, counted in a child process (for `auto`)

Each worker listens on its own socket on the one port (SO_REUSEPORT), made once its models are loaded
(gunicorn makes none: its master holds the address without listening); the kernel gives each new
connection to one of them, by a hash of its addresses. A killed worker fails the requests it holds and the
connections queued on its socket (net.ipv4.tcp_migrate_req=1 moves those to another worker). See
docs/launch.md ("Several processes on one port").
"""

from app.processes.slots import Slot, current, join, process_settings, processes_for

__all__ = ["Slot", "current", "join", "process_settings", "processes_for"]
