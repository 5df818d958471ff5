"""The byte budget for bodies in flight, and glibc's malloc settings.

The trims are timed on a fake clock and run by fake timers (tests/doubles/clock.py): a test moves time
itself, and no test sleeps for a trim to come due.
"""

import asyncio
import threading

import pytest

from app.errors import Busy
from app.memory import TRIM_INTERVAL_S, ByteBudget, Reservation, tune_malloc
from tests.doubles.clock import FakeClock, FakeTimers


def run(coro):
    return asyncio.run(coro)


def budget_on_fake_time(capacity: int, trims: list, record=lambda budget, clock: budget.reserved, **options):
    """A budget trimming after bursts of 50 bytes (unless options say otherwise) on a fake clock, each trim appending
    record(budget, clock) to `trims`; and the fake timers that run its trims when the test advances them."""
    clock = FakeClock()
    timers = FakeTimers(clock)
    options = {"trim_after_bytes": 50, "event_loop": lambda: timers, **options}
    budget = ByteBudget(capacity, trimmer=lambda: trims.append(record(budget, clock)), clock=clock, **options)
    return budget, timers


def test_reservations_within_the_budget_do_not_wait():
    async def main():
        budget = ByteBudget(100)
        await budget.acquire(60, 1)
        await budget.acquire(40, 1)
        assert budget.reserved == 100
    run(main())


def test_a_waiter_is_served_in_order_when_memory_is_released():
    async def main():
        budget = ByteBudget(100)
        await budget.acquire(90, 1)
        order = []

        async def wait(name, size, arrived: asyncio.Event):
            arrived.set()  # wakes the test, which runs on only once this task has taken its place in line
            await budget.acquire(size, 5)
            order.append(name)

        async def arrive(name, size) -> asyncio.Task:
            arrived = asyncio.Event()
            task = asyncio.create_task(wait(name, size, arrived))
            await arrived.wait()
            return task

        big = await arrive("big", 50)
        small = await arrive("small", 5)  # would fit now, but arrived after "big"
        assert budget.waiting == 2 and order == []
        budget.release(90)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and budget.reserved == 55 and budget.peak == 90
    run(main())


def test_a_wait_past_its_deadline_is_busy_with_retry_after_and_leaves_nothing_behind():
    async def main():
        budget = ByteBudget(100, retry_after_s=2)
        await budget.acquire(100, 1)
        with pytest.raises(Busy, match="memory budget") as e:
            await budget.acquire(1, 0.05)
        assert e.value.retry_after_s == 2
        budget.release(100)
        assert budget.reserved == 0
        await budget.acquire(100, 0.05)
    run(main())


def test_a_reservation_shrinks_and_releases_once():
    async def main():
        budget = ByteBudget(100)
        held = Reservation(budget)
        await held.reserve(80, 1)
        held.shrink_to(30)
        assert budget.reserved == 30
        held.release()
        held.release()
        assert budget.reserved == 0
    run(main())


def test_more_than_the_budget_can_never_be_reserved():
    with pytest.raises(ValueError):
        run(ByteBudget(10).acquire(11, 1))


def test_malloc_is_tuned_on_glibc():
    assert tune_malloc()  # the service's platforms (Debian images, Mendel) are glibc


def test_malloc_is_trimmed_after_a_burst_of_bodies_not_after_every_small_one():
    async def main():
        trims = []
        budget, timers = budget_on_fake_time(100, trims)
        for _ in range(20):  # one small body at a time: the line empties after each, no burst
            await budget.acquire(10, 1)
            budget.release(10)
        timers.advance(0)
        assert trims == [] and timers.pending == 0
        await budget.acquire(30, 1)
        await budget.acquire(30, 1)  # 60 at once: a burst
        budget.release(30)
        timers.advance(0)
        assert trims == []  # not while bodies of the burst are still held
        budget.release(30)
        timers.advance(0)
        assert trims == [0]
    run(main())


def test_bursts_in_quick_succession_are_trimmed_once_per_interval():
    async def main():
        trims = []
        budget, timers = budget_on_fake_time(100, trims, record=lambda budget, clock: clock())
        for _ in range(3):
            await budget.acquire(60, 1)
            budget.release(60)
            timers.advance(0.01)
        assert len(trims) == 1  # the first at once; the next two wait for the interval's end
        timers.advance(TRIM_INTERVAL_S * 1.5)
        assert len(trims) == 2 and trims[1] - trims[0] == pytest.approx(TRIM_INTERVAL_S)  # the two later bursts: one
    run(main())


def test_a_trim_due_waits_for_a_burst_begun_meanwhile_and_one_left_on_an_ended_loop_is_replaced():
    trims = []
    loops = []  # the loop the budget sees as running: one fake per asyncio.run below, on one clock
    budget, first = budget_on_fake_time(200, trims, event_loop=lambda: loops[-1])
    second = FakeTimers(first.clock)

    async def burst():
        await budget.acquire(60, 1)
        budget.release(60)

    async def on_first():
        loops.append(first)
        await burst()
        first.advance(0.01)
        await burst()  # its trim is due in a second; the loop ends before
    run(on_first())
    assert trims == [0] and first.pending == 1  # left on the ended loop: never run

    async def on_second():
        loops.append(second)
        await burst()  # the deferral left on the ended loop does not hold this one up
        second.advance(TRIM_INTERVAL_S * 1.2)
        assert trims == [0, 0]
        await burst()  # its trim is due in a second (the last was just now) ...
        await budget.acquire(60, 1)  # ... and when it comes, 60 are held again
        second.advance(TRIM_INTERVAL_S * 1.2)
        assert trims == [0, 0]
        budget.release(60)
        second.advance(0)
        assert trims == [0, 0, 0]
    run(on_second())


def test_on_the_running_loop_a_trim_runs_on_an_executor_thread():
    """The defaults (the running loop's timer and executor, the monotonic clock): the trim comes off the loop."""
    async def main():
        loop = asyncio.get_running_loop()
        trimmed = loop.create_future()
        budget = ByteBudget(100, trim_after_bytes=50,
                            trimmer=lambda: loop.call_soon_threadsafe(trimmed.set_result, threading.current_thread()))
        await budget.acquire(60, 1)
        budget.release(60)
        assert await asyncio.wait_for(trimmed, 10) is not threading.main_thread()
    run(main())


def test_no_trim_when_switched_off():
    async def main():
        trims = []
        budget, timers = budget_on_fake_time(100, trims, trim_after_bytes=None)
        await budget.acquire(100, 1)
        budget.release(100)
        timers.advance(TRIM_INTERVAL_S)
        assert trims == [] and timers.pending == 0
    run(main())


def test_a_request_holding_part_of_the_budget_waits_ahead_of_those_holding_none():
    """A body read, and the door asking for more (an inflated copy): it waits ahead of the requests that hold nothing,
    which could only wait for it to end while it waited for them, each until its timeout (503s for all)."""
    async def main():
        budget = ByteBudget(100)
        holder = Reservation(budget)
        await holder.reserve(60, 1)
        newcomer = asyncio.create_task(budget.acquire(60, 5))  # does not fit: waits
        await asyncio.sleep(0)
        assert budget.waiting == 1
        await asyncio.wait_for(holder.reserve(30, 1), 1)  # fits beside it: taken at once, not after the newcomer
        assert holder.size == 90 and budget.waiting == 1
        top_up = asyncio.create_task(holder.reserve(20, 5))  # does not fit: first in line all the same
        await asyncio.sleep(0)
        holder.shrink_to(40)  # 40 + 20 fits; the newcomer's 60 would not yet
        await asyncio.wait_for(top_up, 1)
        assert holder.size == 60 and not newcomer.done()
        holder.release()
        await asyncio.wait_for(newcomer, 1)
    run(main())


def resident_kb() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))


def test_the_pages_of_a_buffer_still_referred_to_go_back_to_the_os():
    from app.memory import release_pages

    buffer = bytearray(b"\x01" * (32 * 1024 * 1024))
    held = memoryview(buffer)  # as a lingering reader's would: the buffer cannot even be resized
    before = resident_kb()
    released = release_pages(buffer)
    assert released >= len(buffer) - 2 * 4096 and before - resident_kb() >= 30 * 1024
    assert held[0] in (0, 1) and held[len(buffer) // 2] == 0  # whole pages read as zeros; the edges may stay
    assert release_pages(buffer, 100, 200) == 0  # no whole page in 100 bytes
    held.release()


def test_a_request_gives_back_the_pages_of_its_buffers_only_where_they_outlive_it():
    async def main():
        budget = ByteBudget(100 * 1024 * 1024)
        alone, kept = bytearray(b"\x01" * (8 << 20)), bytearray(b"\x01" * (8 << 20))
        reservation = Reservation(budget)
        await reservation.reserve(16 << 20, 1)
        reservation.own(alone)
        reservation.own(kept)
        reservation.own(kept)  # once is enough
        survivor = kept  # a reference beyond the request (an exception's frames, in the service)
        del alone, kept
        reservation.release()
        assert budget.reserved == 0
        assert reservation.lingered >= (8 << 20) - 2 * 4096 and reservation.lingered <= 8 << 20  # `kept` alone
        assert survivor[4096 * 10] == 0
    run(main())
