"""The compute threads' priority: lowered for the calling thread only."""

import os
import sys
import threading

import pytest

from app.threads import lower_this_thread


def nice_of(tid: int) -> int:
    # /proc/<pid>/task/<tid>/stat: field 19 is the nice value (after the parenthesised name)
    stat = open(f"/proc/self/task/{tid}/stat").read()
    return int(stat.rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_lowering_a_thread_leaves_the_others_as_they_were():
    main = nice_of(threading.get_native_id())
    seen = {}

    def worker():
        lower_this_thread(7)
        seen["worker"] = nice_of(threading.get_native_id())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["worker"] == min(19, main + 7)
    assert nice_of(threading.get_native_id()) == main == os.getpriority(os.PRIO_PROCESS, 0)
