"""MainThreadExecutor: a component's state lives on one thread; calls, tasks and timers run
there in order (a call to an idle main thread runs on its caller's thread in its stead, one at a
time with the rest). (Real threads here: this is the one shell the unit tests drive directly.)"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from typing import Iterator

import pytest

from yarnflow.common.errors import RpcTimeoutError, UnavailableError
from yarnflow.common.rpc.endpoint import MainThreadExecutor

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def ex() -> Iterator[MainThreadExecutor]:
    executor = MainThreadExecutor("test-main").start()
    yield executor
    executor.stop()
    assert not executor._thread.is_alive()


def _thread_name() -> str:
    return threading.current_thread().name


def test_call_returns_the_result_run_as_the_main_thread(ex: MainThreadExecutor) -> None:
    assert ex.call(lambda a, b: a + b, 2, 3) == 5
    assert ex.call(ex.in_main_thread) is True  # on the main thread, or on the caller's in its stead
    assert ex.in_main_thread() is False


def test_a_call_runs_after_the_work_queued_before_it(ex: MainThreadExecutor) -> None:
    release = threading.Event()
    order: list[str] = []
    ex.execute(lambda: (release.wait(5), order.append("busy")))
    ex.execute(order.append, "queued")
    threading.Timer(0.05, release.set).start()
    ex.call(order.append, "call")
    assert order == ["busy", "queued", "call"]


def test_call_raises_the_functions_error(ex: MainThreadExecutor) -> None:
    def boom() -> None:
        raise KeyError("no such job")

    with pytest.raises(KeyError, match="no such job"):
        ex.call(boom)
    assert ex.call(lambda: "still alive") == "still alive"


def test_a_timeout_error_raised_by_the_function_is_its_own(ex: MainThreadExecutor) -> None:
    def slow_remote() -> None:
        raise TimeoutError("the remote side timed out")

    with pytest.raises(TimeoutError) as info:
        ex.call(slow_remote)
    assert type(info.value) is TimeoutError
    assert str(info.value) == "the remote side timed out"


def test_call_times_out_when_the_main_thread_is_busy(ex: MainThreadExecutor) -> None:
    release = threading.Event()
    ex.execute(release.wait, 5)
    started = time.monotonic()
    with pytest.raises(RpcTimeoutError) as info:
        ex.call(functools.partial(int, "1"), timeout=0.1)
    assert time.monotonic() - started < 2
    assert "test-main" in str(info.value)
    release.set()
    assert ex.call(lambda: 1) == 1


def test_call_from_the_main_thread_runs_inline(ex: MainThreadExecutor) -> None:
    def outer() -> int:
        return ex.call(lambda: 41) + 1  # would deadlock if queued behind itself

    assert ex.call(outer, timeout=5) == 42


def test_execute_runs_tasks_in_order_on_the_main_thread(ex: MainThreadExecutor) -> None:
    seen: list[tuple[int, str]] = []
    for i in range(500):
        ex.execute(lambda i=i: seen.append((i, _thread_name())))
    ex.call(lambda: None)  # a barrier: everything submitted before it has run
    assert [i for i, _ in seen] == list(range(500))
    assert {name for _, name in seen} == {"test-main"}


def test_execute_keeps_each_submitters_order(ex: MainThreadExecutor) -> None:
    seen: list[tuple[int, int]] = []

    def submit(who: int) -> None:
        for i in range(200):
            ex.execute(seen.append, (who, i))

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ex.call(lambda: None)
    assert len(seen) == 800
    for who in range(4):
        assert [i for w, i in seen if w == who] == list(range(200))


def test_timers_fire_in_due_order_on_the_main_thread(ex: MainThreadExecutor) -> None:
    fired: list[tuple[str, str]] = []
    done = threading.Event()
    ex.schedule(150, lambda: (fired.append(("c", _thread_name())), done.set()))
    ex.schedule(50, lambda: fired.append(("a", _thread_name())))
    ex.schedule(100, lambda: fired.append(("b", _thread_name())))
    assert done.wait(5)
    assert fired == [("a", "test-main"), ("b", "test-main"), ("c", "test-main")]


def test_timers_do_not_fire_early(ex: MainThreadExecutor) -> None:
    fired_at: list[float] = []
    done = threading.Event()
    started = time.monotonic()
    ex.schedule(200, lambda: (fired_at.append(time.monotonic()), done.set()))
    assert done.wait(5)
    assert fired_at[0] - started >= 0.19


def test_calls_are_served_while_a_timer_is_pending(ex: MainThreadExecutor) -> None:
    ex.schedule(10_000, lambda: None)
    started = time.monotonic()
    assert ex.call(lambda: "quick") == "quick"
    assert time.monotonic() - started < 1


def test_cancelled_timers_do_not_fire(ex: MainThreadExecutor) -> None:
    fired: list[str] = []
    done = threading.Event()
    drop = ex.schedule(50, lambda: fired.append("drop"))
    ex.schedule(100, lambda: (fired.append("keep"), done.set()))
    later = ex.schedule(150, lambda: fired.append("later"))
    drop.cancel()
    assert done.wait(5)
    later.cancel()
    time.sleep(0.2)
    ex.call(lambda: None)
    assert fired == ["keep"]


def test_a_timer_can_reschedule_itself(ex: MainThreadExecutor) -> None:
    ticks: list[int] = []
    done = threading.Event()

    def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) < 5:
            ex.schedule(10, tick)
        else:
            done.set()

    ex.schedule(10, tick)
    assert done.wait(5)
    assert ticks == [0, 1, 2, 3, 4]


def test_the_main_thread_survives_an_error_in_a_task(ex: MainThreadExecutor, caplog) -> None:
    def broken() -> None:
        raise RuntimeError("bug in a handler")

    with caplog.at_level(logging.ERROR, logger="yarnflow.common.rpc.endpoint"):
        ex.execute(broken)
        ex.schedule(0, broken)
        time.sleep(0.05)
        assert ex.call(lambda: "alive") == "alive"
    errors = [r for r in caplog.records if "broken" in r.getMessage()]
    assert len(errors) == 2
    assert all(r.exc_info and "bug in a handler" in str(r.exc_info[1]) for r in errors)
    assert ex._thread.is_alive()


def test_stop_rejects_later_calls() -> None:
    ex = MainThreadExecutor("test-stop").start()
    ex.stop()
    assert not ex._thread.is_alive()
    with pytest.raises(UnavailableError, match="test-stop"):
        ex.call(lambda: 1)
    ran: list[int] = []
    ex.execute(ran.append, 1)  # dropped, not raised: fire and forget
    handle = ex.schedule(0, lambda: ran.append(2))
    handle.cancel()
    assert ran == []
    ex.stop()  # idempotent


def test_work_submitted_before_stop_still_runs() -> None:
    ex = MainThreadExecutor("test-drain").start()
    release = threading.Event()
    ex.execute(release.wait, 5)
    results: list[object] = []
    caller = threading.Thread(target=lambda: results.append(ex.call(lambda: "queued")))
    caller.start()
    while ex._queue.qsize() < 1:
        time.sleep(0.001)
    stopper = threading.Thread(target=ex.stop)
    stopper.start()
    release.set()
    caller.join(5)
    stopper.join(5)
    assert results == ["queued"]
    assert not ex._thread.is_alive()


def test_stop_from_the_main_thread() -> None:
    ex = MainThreadExecutor("test-self-stop").start()
    ex.call(ex.stop)
    ex._thread.join(5)
    assert not ex._thread.is_alive()
    with pytest.raises(UnavailableError):
        ex.call(lambda: 1)


def test_calls_racing_stop_fail_fast_instead_of_hanging() -> None:
    """A call that races ``stop`` either runs or gets UnavailableError; it never waits out its
    timeout on a queue nobody reads any more."""
    outcomes: list[str] = []
    rounds = 150
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, to open the window between check and put
    try:
        for round_ in range(rounds):
            _race_once(round_, outcomes)
    finally:
        sys.setswitchinterval(switch_interval)
    assert outcomes.count("hung") == 0
    assert len(outcomes) == rounds * 6


def _race_once(round_: int, outcomes: list[str]) -> None:
    ex = MainThreadExecutor(f"test-race-{round_}").start()
    go = threading.Event()

    def hammer() -> None:
        go.wait()
        while True:
            try:
                ex.call(lambda: None, timeout=1)
            except UnavailableError:
                outcomes.append("unavailable")
                return
            except RpcTimeoutError:
                outcomes.append("hung")
                return

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.002)
    ex.stop()
    for t in threads:
        t.join(10)
