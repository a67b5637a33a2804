"""The one way a component is called: ``RpcEndpoint.rpc_invoke`` checks the fencing token once,
runs the method on the component's main thread and waits for a result that comes later; every
component declares its RPCs fenced exactly as the IDL says."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from yarnflow.am.dispatcher.dispatcher import Dispatcher
from yarnflow.am.jobmaster.job_master import JobMaster
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.errors import FencingTokenError, RpcTimeoutError, UnavailableError
from yarnflow.common.rpc.endpoint import UNFENCED, MainThreadExecutor, RpcEndpoint, fenced, rpc
from yarnflow.common.rpc.services import (
    DISPATCHER_METHODS,
    JOB_MASTER_METHODS,
    RESOURCE_MANAGER_METHODS,
    TASK_EXECUTOR_METHODS,
)
from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _job_token(endpoint: Counter, job: str, *args: Any) -> Any:
    return endpoint.jobs.get(job, UNFENCED if job == "unknown" else None)


class Counter(RpcEndpoint):
    fencing_token = "leader-1"

    def __init__(self, main: MainThreadExecutor | None) -> None:
        super().__init__("Counter", main)
        self.count = 0
        self.threads: list[str] = []
        self.jobs = {"j1": "jm-1", "j2": frozenset({"jm-2a", "jm-2b"})}
        self.later: Future[int] = Future()

    @fenced()
    def add(self, n: int) -> int:
        self.threads.append(threading.current_thread().name)
        self.count += n
        return self.count

    @rpc
    def peek(self) -> int:
        return self.count

    @fenced(_job_token)
    def for_job(self, job: str) -> str:
        return job

    @fenced()
    def result_later(self) -> Future[int]:
        return self.later

    def not_an_rpc(self) -> None:
        raise AssertionError("called")


@pytest.fixture
def counter() -> Any:
    main = MainThreadExecutor("counter-main").start()
    yield Counter(main)
    main.stop()


def test_a_fenced_call_runs_as_the_main_thread_with_the_right_token(counter: Counter) -> None:
    assert counter.rpc_invoke("add", "leader-1", (2,)) == 2
    assert counter.rpc_invoke("peek", None, ()) == 2


def test_a_call_waits_for_what_the_main_thread_runs_and_for_what_was_queued_before_it(counter: Counter) -> None:
    main = counter.main_thread
    assert main is not None
    release = threading.Event()
    order: list[str] = []
    main.execute(lambda: (release.wait(5), order.append("busy")))  # the main thread is busy
    main.execute(order.append, "queued")
    caller = threading.Thread(target=lambda: order.append(f"call {counter.rpc_invoke('add', 'leader-1', (1,))}"))
    caller.start()
    time.sleep(0.05)
    assert order == []  # the call waits: it never runs beside the main thread's work
    release.set()
    caller.join(5)
    assert order == ["busy", "queued", "call 1"]  # behind what was there before it


def test_a_call_to_an_idle_main_thread_runs_in_its_stead_one_at_a_time(counter: Counter) -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    def add_slowly() -> None:
        inside.append(1)
        if len(inside) > 1:
            overlaps.append(1)
        time.sleep(0.001)
        inside.pop()
        counter.count += 1

    assert counter.main_thread is not None
    callers = [threading.Thread(target=lambda: [counter.main_thread.call(add_slowly) for _ in range(50)])  # type: ignore[union-attr]
               for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    assert counter.count == 200 and overlaps == []
    assert counter.main_thread.in_main_thread() is False


def test_a_stale_token_is_refused_before_the_method_runs(counter: Counter) -> None:
    with pytest.raises(FencingTokenError, match="Counter: add with a stale fencing token 'leader-0'"):
        counter.rpc_invoke("add", "leader-0", (5,))
    assert counter.count == 0


def test_a_method_may_say_which_token_it_expects_per_call(counter: Counter) -> None:
    assert counter.rpc_invoke("for_job", "jm-1", ("j1",)) == "j1"
    assert counter.rpc_invoke("for_job", "jm-2b", ("j2",)) == "j2"  # any of several
    assert counter.rpc_invoke("for_job", "anything", ("unknown",)) == "unknown"  # UNFENCED
    with pytest.raises(FencingTokenError, match="stale"):
        counter.rpc_invoke("for_job", "jm-1", ("j2",))
    with pytest.raises(FencingTokenError, match="no fencing token"):  # None: nothing is valid
        counter.rpc_invoke("for_job", "jm-1", ("j3",))


def test_only_declared_methods_are_served_and_as_declared(counter: Counter) -> None:
    with pytest.raises(UnavailableError, match="does not serve not_an_rpc"):
        counter.rpc_invoke("not_an_rpc", None, ())
    with pytest.raises(UnavailableError, match="is fenced"):
        counter.rpc_invoke("add", None, (1,))  # a service that carries no token for a fenced method
    with pytest.raises(UnavailableError, match="is not fenced"):
        counter.rpc_invoke("peek", "leader-1", ())
    assert counter.count == 0


def test_a_result_that_comes_later_is_waited_for_off_the_main_thread(counter: Counter) -> None:
    got: list[int] = []
    caller = threading.Thread(target=lambda: got.append(counter.rpc_invoke("result_later", "leader-1", ())))
    caller.start()
    assert counter.rpc_invoke("add", "leader-1", (1,)) == 1  # the main thread is free meanwhile
    counter.later.set_result(42)
    caller.join(5)
    assert got == [42]


def test_a_result_that_does_not_come_times_out(counter: Counter) -> None:
    counter.rpc_result_timeout_s = 0.05
    with pytest.raises(RpcTimeoutError, match="result_later had no result"):
        counter.rpc_invoke("result_later", "leader-1", ())


def test_a_standing_in_caller_logs_as_the_component_s_job() -> None:
    from yarnflow.common import logs

    main = MainThreadExecutor("job-main").start()
    main.job = "job-42"
    try:
        assert main.call(lambda: getattr(logs.bound, "job", None)) == "job-42"
        assert getattr(logs.bound, "job", None) is None  # the caller's own binding is back
    finally:
        main.stop()


def test_without_a_main_thread_calls_run_on_the_callers_thread() -> None:
    counter = Counter(None)
    counter.rpc_invoke("add", "leader-1", (1,))
    assert counter.threads == [threading.current_thread().name]


@pytest.mark.parametrize("component, methods", [
    (Dispatcher, DISPATCHER_METHODS),
    (ResourceManager, RESOURCE_MANAGER_METHODS),
    (JobMaster, JOB_MASTER_METHODS),
    (TaskExecutor, TASK_EXECUTOR_METHODS),
], ids=["Dispatcher", "ResourceManager", "JobMaster", "TaskExecutor"])
def test_every_component_declares_its_rpcs_fenced_as_the_idl_says(component: type[RpcEndpoint],
                                                                  methods: dict[str, bool]) -> None:
    assert issubclass(component, RpcEndpoint)
    assert component.undeclared(methods) == []


def test_a_method_the_idl_fences_but_the_component_does_not_is_reported() -> None:
    assert Counter.undeclared({"add": True, "peek": False}) == []
    assert Counter.undeclared({"add": False, "peek": True, "gone": False}) == ["add", "peek", "gone"]
