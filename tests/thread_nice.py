"""A thread's nice value, read from /proc as the kernel keeps it (Linux only): what tests of thread priorities
(app/threads.py) compare."""

from __future__ import annotations

import sys
import threading

import pytest

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def nice_of(tid: int) -> int:
    # /proc/<pid>/task/<tid>/stat: field 19 is the nice value (after the parenthesised name)
    with open(f"/proc/self/task/{tid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


def this_thread() -> tuple[str, int]:
    """The calling thread's name and nice value."""
    return threading.current_thread().name, nice_of(threading.get_native_id())
