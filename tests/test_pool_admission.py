"""Admission to a pool's line, on a fake clock: by count always, by time while overloaded, and the
overload ending OVERLOAD_HOLD_S after the last refusal. No interpreter and no waiting: the clock moves
only when the test moves it."""

import pytest

from app.errors import Busy
from app.pool.admission import OVERLOAD_HOLD_S, Admission
from tests.doubles.clock import FakeClock


def admission(max_waiting=4, max_queue_ms=50.0, clock=None) -> Admission:
    return Admission("m/cpu", max_waiting, max_queue_ms, retry_after_s=2, clock=clock or FakeClock())


def learned(adm: Admission, ms: float) -> Admission:
    for _ in range(3):
        adm.note_invoke(ms)
    return adm


def test_the_line_holds_the_healthy_interpreters_and_max_waiting_then_refuses_with_retry_after():
    adm = admission(max_waiting=2)
    for _ in range(3):
        adm.enter(healthy=1)
    with pytest.raises(Busy, match="all 1 interpreters busy and 2 requests already waiting") as refused:
        adm.enter(healthy=1)
    assert refused.value.retry_after_s == 2 and adm.admitted == 3
    adm.leave()
    adm.enter(healthy=1)  # a place given back is a place to take
    assert adm.admitted == 3


def test_a_line_that_never_overflowed_is_bounded_by_count_only_however_slow_the_invokes():
    adm = learned(admission(max_waiting=4, max_queue_ms=50), 1000.0)  # each invoke 1 s: the line is 5 s deep
    for _ in range(5):
        adm.enter(healthy=1)
    assert not adm.overloaded and adm.admitted == 5


def test_once_overloaded_a_request_is_refused_when_the_line_ahead_would_take_longer_than_max_queue_ms():
    clock = FakeClock()
    adm = learned(admission(max_waiting=4, max_queue_ms=50, clock=clock), 20.0)
    assert adm.invoke_ms == pytest.approx(20.0)
    for _ in range(5):
        adm.enter(healthy=1)
    with pytest.raises(Busy, match="4 requests already waiting"):
        adm.enter(healthy=1)  # the line overflows: overloaded from now
    assert adm.overloaded
    for _ in range(3):
        adm.leave()  # 1 running + 1 ahead: a new one would wait 2 x 20 ms, within 50
    adm.enter(healthy=1)
    with pytest.raises(Busy, match=r"overloaded.*~60 ms to clear.*MAX_QUEUE_MS 50"):
        adm.enter(healthy=1)  # 3 x 20 ms ahead: within the count, over the time bound
    assert adm.admitted == 3


def test_two_interpreters_clear_the_line_twice_as_fast():
    adm = learned(admission(max_waiting=8, max_queue_ms=50), 20.0)
    for _ in range(10):
        adm.enter(healthy=2)
    with pytest.raises(Busy):
        adm.enter(healthy=2)
    for _ in range(5):
        adm.leave()
    adm.enter(healthy=2)  # 5 held, 2 running: 4 x 20 / 2 = 40 ms ahead
    adm.enter(healthy=2)  # 5 x 20 / 2 = 50 ms: at the bound, admitted
    with pytest.raises(Busy, match="~60 ms to clear"):
        adm.enter(healthy=2)


def test_the_overload_ends_after_OVERLOAD_HOLD_S_without_a_refusal_and_each_refusal_renews_it():
    clock = FakeClock()
    adm = learned(admission(max_waiting=2, max_queue_ms=10, clock=clock), 20.0)
    for _ in range(3):
        adm.enter(healthy=1)
    with pytest.raises(Busy, match="already waiting"):
        adm.enter(healthy=1)
    adm.leave()  # 1 running + 1 waiting: a new one would wait 2 x 20 ms, over the 20 ms bound
    clock.advance(OVERLOAD_HOLD_S - 0.001)
    assert adm.overloaded
    with pytest.raises(Busy, match="overloaded"):
        adm.enter(healthy=1)  # by time: and this refusal holds the overload on
    clock.advance(OVERLOAD_HOLD_S - 0.001)
    assert adm.overloaded
    clock.advance(0.002)
    assert not adm.overloaded
    adm.enter(healthy=1)  # by count only again
    assert adm.admitted == 3


def test_a_request_that_waited_past_the_bound_is_too_late_only_while_overloaded():
    clock = FakeClock()
    adm = admission(max_waiting=0, max_queue_ms=30, clock=clock)
    since = clock()
    clock.advance(0.060)
    assert adm.too_late(since, clock()) is None  # not overloaded: served however long it waited
    adm.enter(healthy=1)
    with pytest.raises(Busy):
        adm.enter(healthy=1)
    late = adm.too_late(since, clock())
    assert isinstance(late, Busy) and "waited 60 ms in line" in str(late) and late.retry_after_s == 2
    assert adm.too_late(clock() - 0.030, clock()) is None  # at the bound: in time


def test_the_time_bound_is_never_shorter_than_one_invoke():
    clock = FakeClock()
    adm = learned(admission(max_waiting=0, max_queue_ms=30, clock=clock), 100.0)
    assert adm.queue_bound_ms == pytest.approx(100.0)
    adm.enter(healthy=1)
    with pytest.raises(Busy):
        adm.enter(healthy=1)
    assert adm.too_late(clock() - 0.090, clock()) is None
    assert adm.too_late(clock() - 0.110, clock()) is not None


def test_without_max_queue_ms_nothing_is_bounded_by_time():
    clock = FakeClock()
    adm = learned(admission(max_waiting=1, max_queue_ms=0, clock=clock), 1000.0)
    adm.enter(healthy=1)
    adm.enter(healthy=1)
    with pytest.raises(Busy, match="already waiting"):
        adm.enter(healthy=1)
    adm.leave()
    adm.enter(healthy=1)
    clock.advance(60)
    assert adm.too_late(clock() - 60, clock()) is None


def test_the_invoke_time_is_a_running_average_weighted_to_the_recent():
    adm = admission()
    assert adm.invoke_ms is None
    adm.note_invoke(10.0)
    assert adm.invoke_ms == 10.0
    adm.note_invoke(20.0)
    assert adm.invoke_ms == pytest.approx(12.0)
    for _ in range(30):
        adm.note_invoke(20.0)
    assert adm.invoke_ms == pytest.approx(20.0, abs=0.02)


def test_the_overload_lasts_as_long_as_its_setting_says():
    clock = FakeClock()
    adm = Admission("m/cpu", 0, 10, retry_after_s=2, clock=clock, hold_s=0.5)
    adm.enter(healthy=1)
    with pytest.raises(Busy):
        adm.enter(healthy=1)
    clock.advance(0.499)
    assert adm.overloaded
    clock.advance(0.002)
    assert not adm.overloaded
