"""Waiting, in tests, for something to happen: never for time to pass.

A test that sleeps for a window ("it has surely happened by now") fails on a loaded machine, or passes
while proving less. These wait for a condition instead, and fail with what they waited for once a
generous bound has passed:
  - `until()`: a condition only observable by looking (another process, a socket, a file), polled;
  - `turns_until()`: a condition other tasks on the running event loop bring about, given loop turns
    (no time passes: a task just created reaches its first `await` in one turn).
Where the code under test offers an event (a threading.Event of a double, a pool's `changed` condition,
an asyncio future), wait on that instead; where it keeps time, drive it with the fake clock and timers
of tests/doubles/clock.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02


def until(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = POLL_S) -> T:
    """Poll `condition()` until it returns a true value, and return that value; AssertionError naming `what`
    after `timeout_s`. The condition may itself raise (a process that died while it was awaited)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(poll_s)  # the pace of a poll, not a window: the condition ends the wait
    return value


async def turns_until(condition: Callable[[], object], what: str, turns: int = 100) -> None:
    """Let the running event loop run its other ready tasks, a turn at a time, until `condition()` holds;
    AssertionError naming `what` after `turns` turns. For what tasks on this loop do, not threads: a
    thread's progress is awaited on its own event (asyncio.to_thread(event.wait, timeout))."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)  # one turn of the event loop, no time: the tasks ready to run take a step
    raise AssertionError(f"not within {turns} turns of the event loop: {what}")


def refuses_connections(port: int) -> bool:
    """A condition for until(): nothing accepts connections on this loopback port (a server stopped listening)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True
