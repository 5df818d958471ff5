"""Thread priorities: the event loop first.

The event loop answers every request, refuses the ones the line cannot hold, and hands work to
threads; the threads that compute (CPU interpreters, image work) can fill every core. When they
do, a loop at the same priority gets a fair share at best and every answer, a 503 included, waits
behind the computing (2 cores, 10x open-loop overload: 503 p99 82 ms at the same priority, 45 ms
with the compute threads at nice +10). Lowering the compute threads' priority lets the loop run as
soon as it has something to do, and costs them nothing when it has not. Linux only: there
`setpriority` on a thread id sets that thread's nice value.
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

