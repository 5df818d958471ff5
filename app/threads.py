"""Thread priorities and the GIL's hand-over: the event loop and the devices first.

The event loop answers every request, refuses the ones the line cannot hold, and hands work to
threads; the threads that compute (CPU interpreters, image work) can fill every core. When they
do, a loop at the same priority gets a fair share at best and every answer, a 503 included, waits
behind the computing (2 cores, 10x overload: 503s took p50 ~400 ms). Lowering the compute threads'
priority lets the loop run as soon as it has something to do, and costs them nothing when it has
not. Linux only: there `setpriority` on a thread id sets that thread's nice value.

The GIL: a thread that wants it waits until the holder lets go, which a thread running Python
code does only every switch interval (Python's default: 5 ms). A device thread whose invoke has
just returned needs the GIL for a few microseconds to answer and take the next input; behind an
event loop or image thread busy in Python, it waited up to that long while the device idled.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_this_thread(steps: int) -> None:
    """Lower the calling thread's priority by `steps` nice values (relative to what it has, at most
    19; 0 leaves it as it is). Never raises."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError as e:  # a lower priority is always allowed; a sandbox may still say no
        log.warning("could not lower thread %s by %d nice steps: %s", threading.current_thread().name, steps, e)


def set_gil_switch_interval(ms: float) -> None:
    """How long a thread running Python code keeps the GIL from another that wants it (process-wide)."""
    sys.setswitchinterval(ms / 1000)
