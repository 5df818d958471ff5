"""The byte budget for bodies in flight, and glibc's malloc settings."""

import asyncio
import time

import pytest

from app.errors import Busy
from app.memory import TRIM_INTERVAL_S, ByteBudget, Reservation, tune_malloc


def run(coro):
    return asyncio.run(coro)


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

        async def wait(name, size):
            await budget.acquire(size, 5)
            order.append(name)

        big = asyncio.create_task(wait("big", 50))
        await asyncio.sleep(0.01)
        small = asyncio.create_task(wait("small", 5))  # would fit now, but arrived after "big"
        await asyncio.sleep(0.01)
        assert order == []
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
        budget = ByteBudget(100, trim_after_bytes=50, trimmer=lambda: trims.append(budget.reserved))
        for _ in range(20):  # one small body at a time: the line empties after each, no burst
            await budget.acquire(10, 1)
            budget.release(10)
        await asyncio.sleep(0.05)
        assert trims == []
        await budget.acquire(30, 1)
        await budget.acquire(30, 1)  # 60 at once: a burst
        budget.release(30)
        await asyncio.sleep(0.05)
        assert trims == []  # not while bodies of the burst are still held
        budget.release(30)
        await asyncio.sleep(0.05)
        assert trims == [0]
    run(main())


def test_bursts_in_quick_succession_are_trimmed_once_per_interval():
    async def main():
        trims = []
        budget = ByteBudget(100, trim_after_bytes=50, trimmer=lambda: trims.append(time.monotonic()))
        for _ in range(3):
            await budget.acquire(60, 1)
            budget.release(60)
            await asyncio.sleep(0.01)
        assert len(trims) == 1  # the first at once; the next two wait for the interval's end
        await asyncio.sleep(TRIM_INTERVAL_S * 1.5)
        assert len(trims) == 2 and trims[1] - trims[0] >= TRIM_INTERVAL_S * 0.99  # the two later bursts were one
    run(main())


def test_a_trim_due_waits_for_a_burst_begun_meanwhile_and_one_left_on_an_ended_loop_is_replaced():
    trims = []
    budget = ByteBudget(200, trim_after_bytes=50, trimmer=lambda: trims.append(budget.reserved))

    async def burst(hold_s: float = 0.0):
        await budget.acquire(60, 1)
        await asyncio.sleep(hold_s)
        budget.release(60)

    async def first():
        await burst()
        await asyncio.sleep(0.01)
        await burst()  # its trim is due in a second; the loop ends before
    run(first())
    assert trims == [0]

    async def second():
        await burst()  # the deferral left on the ended loop does not hold this one up
        await asyncio.sleep(TRIM_INTERVAL_S * 1.2)
        assert trims == [0, 0]
        await burst()  # its trim is due in a second (the last was just now) ...
        await budget.acquire(60, 1)  # ... and when it comes, 60 are held again
        await asyncio.sleep(TRIM_INTERVAL_S * 1.2)
        assert trims == [0, 0]
        budget.release(60)
        await asyncio.sleep(0.05)
        assert trims == [0, 0, 0]
    run(second())


def test_no_trim_when_switched_off():
    async def main():
        trims = []
        budget = ByteBudget(100, trim_after_bytes=None, trimmer=lambda: trims.append(1))
        await budget.acquire(100, 1)
        budget.release(100)
        await asyncio.sleep(0.05)
        assert trims == []
    run(main())
