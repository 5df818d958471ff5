"""The compute threads' priority: lowered for the calling thread only; another thread's calls below it, on a thread of
their own."""

import os
import threading

import pytest

from app.threads import Below, lower_this_thread
from tests.thread_nice import linux_only, nice_of, this_thread
from tests.waiting import until


@linux_only
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


def running(name: str) -> bool:
    return any(thread.name == name for thread in threading.enumerate())


@linux_only
def test_below_runs_each_call_on_one_lowered_thread_of_its_own_and_hands_back_what_it_returned_or_raised():
    seen = {}

    def caller():
        below = Below(7)
        seen["caller"] = this_thread()
        try:
            seen["first"] = below.call(lambda: (this_thread(), threading.get_native_id()))
            seen["pow"] = below.call(pow, 2, 10)
            with pytest.raises(ZeroDivisionError):
                below.call(divmod, 1, 0)  # the caller's to handle, as if it had called it itself
            seen["again"] = below.call(lambda: (this_thread(), threading.get_native_id()))
            seen["caller after"] = this_thread()
        finally:
            below.close()

    thread = threading.Thread(target=caller, name="below-test")
    thread.start()
    thread.join(10)
    main = nice_of(threading.get_native_id())
    assert seen["caller"] == seen["caller after"] == ("below-test", main)  # the caller's priority never changed
    assert seen["first"][0] == ("below-test-below", min(19, main + 7))
    assert seen["again"] == seen["first"]  # the same thread, after a call that raised
    assert seen["pow"] == 1024
    until(lambda: not running("below-test-below"), 10, "the thread below to end once closed")


def test_a_below_never_called_starts_no_thread_and_closes_at_once():
    before = threading.active_count()
    below = Below(5)
    below.close()
    assert threading.active_count() == before
