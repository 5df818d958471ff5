"""Thread priorities: the event loop first while the service is overloaded, the CPU interpreters level with
every other process the rest of the time.

The event loop answers every request, refuses the ones the line cannot hold, and hands work to threads; the
threads that compute (CPU interpreters, image work) can fill every core. When they do, a loop at the same
priority gets a fair share at best and every answer, a 503 included, waits behind the computing (2 cores, 10x
open-loop overload: 503 p99 82 ms at the same priority, 45 ms with the compute threads at nice +10). Lowering a
thread's priority lets the loop run as soon as it has something to do, and costs that thread nothing while the
cores are idle. Linux only: there `setpriority` on a thread id sets that thread's nice value.

It costs when the cores are not idle: a process at nice 0 beside the service (a busy peer, another program) takes
about 9 parts in 10 of a core from a thread at nice +10. A CPU interpreter is the device of a host without a TPU:
lowered for good, a Frigate client's invoke waited behind any busy process (issue 42's attacks on the ZMQ door,
whose attacker is such a process, 2 cores: beside one that only spins, p99 90-100 ms with the interpreters at +10,
at most 28 ms level; docs/frigate.md). So the image threads are lowered for good (`lower_this_thread`), and a CPU
interpreter's lane runs at the process's priority and hands its invokes to a thread of its own below it (`Below`)
only while its line is overloaded, that is while the loop is refusing requests (app/pool/lane.py). A thread cannot
lower itself for a while instead: without CAP_SYS_NICE, Docker's default, it can never raise its priority again.
Under the 10x overload above, refusals come as fast this way as with every compute thread lowered (503 p99 65.5
against 67.1 ms; 133 ms with every thread level, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


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


class Below:
    """A thread `steps` nice values below the process that runs the calls of one other thread, which waits for
    each: that thread's work below the loop's priority while it must be, and at its own the rest of the time.
    Started at the first call and named after its caller (a lane that never runs below never makes one); a daemon,
    as the lanes' threads are, so that a call that never returns never holds up the process's exit."""

    def __init__(self, steps: int):
        self.steps = steps
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple, Future] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the thread below, and what it returned or raised. One caller thread at a time."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=f"{threading.current_thread().name}-below")
            self._thread.start()
        done: Future = Future()
        self._calls.put((fn, args, done))
        return done.result()

    def close(self) -> None:
        """The thread ends after the calls handed to it (none can be, once its caller has gone)."""
        if self._thread is not None:
            self._calls.put(None)

    def _serve(self) -> None:
        lower_this_thread(self.steps)
        while (call := self._calls.get()) is not None:
            fn, args, done = call
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # the caller's to handle, as if it had made the call itself
                done.set_exception(e)
