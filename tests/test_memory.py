"""The byte budget for bodies in flight, and glibc's malloc settings."""

import asyncio

import pytest

from app.errors import Busy
from app.memory import ByteBudget, Reservation, tune_malloc


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
