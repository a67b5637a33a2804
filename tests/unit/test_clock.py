"""Injectable time: ManualClock and ManualTimerService."""

from __future__ import annotations

import pytest

from yarnflow.common.clock import ManualClock, ManualTimerService, SystemClock

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == clock.monotonic_ms() == 1_000
    clock.advance(250)
    assert clock.now_ms() == 1_250
    clock.advance(0)
    assert clock.now_ms() == 1_250
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.now_ms() == 1_250


def test_system_clock_is_plausible() -> None:
    clock = SystemClock()
    assert clock.now_ms() > 1_600_000_000_000
    a = clock.monotonic_ms()
    assert clock.monotonic_ms() >= a


def test_timers_fire_in_due_order_at_their_due_time() -> None:
    timers = ManualTimerService(ManualClock(100))
    fired: list[tuple[str, int]] = []
    for name, delay in [("c", 30), ("a", 10), ("b", 20), ("d", 1_000)]:
        timers.schedule(delay, lambda name=name: fired.append((name, timers.clock.now_ms())))
    timers.advance(5)
    assert fired == []
    timers.advance(25)
    assert fired == [("a", 110), ("b", 120), ("c", 130)]
    assert timers.clock.now_ms() == 130
    timers.advance(2_000)
    assert fired[-1] == ("d", 1_100)
    assert timers.clock.now_ms() == 2_130


def test_timers_due_together_fire_in_scheduling_order() -> None:
    timers = ManualTimerService()
    fired: list[int] = []
    for i in range(10):
        timers.schedule(50, lambda i=i: fired.append(i))
    timers.advance(50)
    assert fired == list(range(10))


def test_negative_delay_fires_at_the_next_advance() -> None:
    timers = ManualTimerService()
    fired: list[str] = []
    timers.schedule(-5, lambda: fired.append("now"))
    timers.advance(0)
    assert fired == ["now"]


def test_cancel_works() -> None:
    timers = ManualTimerService()
    fired: list[str] = []
    keep = timers.schedule(10, lambda: fired.append("keep"))
    drop = timers.schedule(10, lambda: fired.append("drop"))
    later = timers.schedule(20, lambda: fired.append("later"))
    drop.cancel()
    timers.advance(15)
    later.cancel()
    timers.advance(100)
    assert fired == ["keep"]
    keep.cancel()  # cancelling a fired timer is harmless
    assert timers.clock.now_ms() == 115


def test_timers_scheduled_by_a_timer_fire_within_the_same_advance() -> None:
    timers = ManualTimerService()
    fired: list[int] = []

    def tick() -> None:
        fired.append(timers.clock.now_ms())
        if len(fired) < 5:
            timers.schedule(10, tick)

    timers.schedule(10, tick)
    timers.advance(35)
    assert fired == [10, 20, 30]
    timers.advance(100)
    assert fired == [10, 20, 30, 40, 50]
