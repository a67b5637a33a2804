"""The TaskExecutor's memory model: the RocksDB backends of a slot share one block cache and write
buffer manager inside the slot's managed memory; the memory watchdog warns near the process size
and fails the tasks (naming the limit) before YARN would kill the container; and the JobMaster
fails a job for good after repeated memory failures instead of restarting it forever."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.test_job_master_core import Driver, S, pipeline
from yarnflow.am.jobmaster.actions import DeployTask
from yarnflow.am.jobmaster.failure_handler import is_memory_failure
from yarnflow.am.scheduler.restart import ConfigurationError, max_memory_failures
from yarnflow.common.config import Configuration
from yarnflow.common.errors import MemoryLimitError
from yarnflow.common.messages import ErrorInfo, SlotReport
from yarnflow.common.states import JobStatus
from yarnflow.worker.memory.manager import MemoryManager
from yarnflow.worker.memory.rocksdb_memory import KIND, RocksDBMemory, rocksdb_usage, slot_rocksdb_memory
from yarnflow.worker.memory.watchdog import MemoryWatchdog
from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MB = 1 << 20


# ---- shared RocksDB memory ------------------------------------------------------------------------

def test_the_tasks_of_a_slot_share_one_rocksdb_memory_reserved_from_the_slot_until_the_last_ends() -> None:
    manager = MemoryManager(total_bytes=256 * MB, num_slots=2)
    a = slot_rocksdb_memory(manager, 0, "task-a", {})
    b = slot_rocksdb_memory(manager, 0, "task-b", {})
    other = slot_rocksdb_memory(manager, 1, "task-c", {"state.backend.rocksdb.memory.fixed-per-slot": "32 mb"})
    assert a is b and a is not None and other is not None and other is not a
    assert (a.size, other.size) == (128 * MB, 32 * MB)  # the slot's managed memory, or the fixed size
    assert a.write_buffer_limit == 64 * MB and a.write_buffer_size == 16 * MB  # ratio 0.5, a quarter of it each
    assert manager.used_bytes == 160 * MB
    budget = manager.budget(0, 1.0, "task-d")
    assert not budget.try_reserve(1)  # batch operators of that slot find its memory taken
    manager.release_owner("task-a")
    assert manager.used_bytes == 160 * MB  # task-b still uses it
    manager.release_owner("task-b")
    assert manager.used_bytes == 32 * MB and manager.shared_resources(KIND) == [other]
    assert budget.try_reserve(128 * MB)
    assert slot_rocksdb_memory(manager, 1, "x", {"state.backend.rocksdb.memory.managed": "false"}) is None


def test_a_rocksdb_backend_keeps_its_blocks_and_memtables_in_the_shared_cache(tmp_path) -> None:
    memory = RocksDBMemory(16 * MB)
    backend = RocksDBKeyedStateBackend(128, range(0, 128), str(tmp_path / "db"), memory=memory)
    try:
        table = backend.aggregate_table("sums", ["k"], [("n", "sum")])
        keys = np.arange(200_000, dtype=np.int64)
        table.upsert(pa.table({"k": keys, "n": np.ones(len(keys), np.int64)}))
        assert memory.usage() > 1 * MB  # the memtables are charged to the cache
        assert memory.usage() <= memory.size * 1.1
        again = table.upsert(pa.table({"k": keys[:10], "n": np.full(10, 2, np.int64)}))
        assert again.column("n").to_pylist() == [3] * 10  # it still reads what it wrote
    finally:
        backend.close()


def test_the_memory_a_slots_rocksdb_holds_is_reported(tmp_path) -> None:
    manager = MemoryManager(total_bytes=64 * MB, num_slots=1)
    memory = slot_rocksdb_memory(manager, 0, "t", {})
    backend = RocksDBKeyedStateBackend(128, range(0, 128), str(tmp_path / "db"), memory=memory)
    try:
        backend.aggregate_table("s", ["k"], [("n", "sum")]).upsert(
            pa.table({"k": np.arange(50_000), "n": np.ones(50_000, np.int64)}))
        assert rocksdb_usage(manager) == memory.usage() > 0
    finally:
        backend.close()


# ---- the watchdog ---------------------------------------------------------------------------------

class Measured:
    def __init__(self) -> None:
        self.rss, self.arrow, self.failed = 0, 0, []

    def watchdog(self, **kw) -> MemoryWatchdog:
        return MemoryWatchdog("TaskExecutor te-1", 1000 * MB, measure=lambda: self.rss,
                              arrow_bytes=lambda: self.arrow, parts=lambda: (250 * MB, 100 * MB, 40 * MB),
                              fail_tasks=lambda error: self.failed.append(error) or 2, **kw)


def test_the_watchdog_measures_the_cpu_the_process_used_between_checks() -> None:
    import time

    dog = Measured().watchdog()
    dog.check()
    busy_until = time.process_time() + 0.3
    started = time.monotonic()
    while time.process_time() < busy_until:
        pass
    time.sleep(max(0.0, 0.6 - (time.monotonic() - started)))  # about half of the interval busy
    dog.check()
    assert 0.1 <= dog.cpu_load <= 1.5 and dog.status().cpu_load == dog.cpu_load
    time.sleep(0.3)
    dog.check()
    assert dog.cpu_load <= 0.3  # idle since (a check itself costs little)


def test_the_watchdog_warns_near_the_size_and_fails_the_tasks_at_the_limit_naming_it(caplog) -> None:
    m = Measured()
    dog = m.watchdog(enforce=True)
    m.rss = 500 * MB
    assert dog.check() == "ok" and not m.failed
    m.rss = 900 * MB
    assert dog.check() == "warning" and not m.failed
    assert "uses 900 MB of its 1000 MB (taskmanager.memory.process.size)" in caplog.text
    assert dog.status().level == "warning" and dog.status().used_bytes == 900 * MB
    m.rss, m.arrow = 960 * MB, 300 * MB
    assert dog.check() == "critical"
    [error] = m.failed
    assert isinstance(error, MemoryLimitError)
    text = str(error)
    assert "uses 960 MB of its 1000 MB (taskmanager.memory.process.size)" in text
    assert "Arrow buffers 300 MB" in text and "managed memory 100 of 250 MB" in text and "RocksDB caches hold 40 MB" in text
    assert "the rest (Python objects, libraries) 560 MB" in text and "before YARN kills the container" in text
    m.rss = 400 * MB
    assert dog.check() == "ok" and dog.status().peak_bytes == 960 * MB and dog.failures == 1


def test_a_taskexecutor_stuck_at_its_limit_with_no_task_left_exits() -> None:
    from yarnflow.worker.memory.watchdog import STUCK_CHECKS, TRIM_TICKS

    m, reasons = Measured(), []
    dog = m.watchdog(enforce=True, on_stuck=reasons.append)
    m.rss = 990 * MB
    dog.check()  # fails the 2 tasks it has
    dog._fail_tasks = lambda error: 0  # they ended; the memory stays (a module global of user code)
    for _ in range(TRIM_TICKS + STUCK_CHECKS - 2):
        dog.check()
    assert reasons == []
    dog.check()
    [why] = reasons
    assert why.startswith("it stayed at its memory limit with no task running (TaskExecutor te-1 uses 990 MB")
    for _ in range(STUCK_CHECKS):
        dog.check()
    assert len(reasons) == 1  # once


def test_outside_a_yarn_container_the_watchdog_only_warns() -> None:
    m = Measured()
    dog = m.watchdog(enforce=False)
    m.rss = 990 * MB
    assert dog.check() == "critical" and not m.failed


def test_arrows_pool_over_task_off_heap_size_fails_the_tasks_wherever_they_run() -> None:
    m = Measured()
    dog = m.watchdog(enforce=False, arrow_limit_bytes=200 * MB)
    m.rss, m.arrow = 400 * MB, 250 * MB
    assert dog.check() == "critical"
    assert "Arrow's memory pool holds 250 MB, more than taskmanager.memory.task.off-heap.size (200 MB)" in str(m.failed[0])


def test_the_watchdog_is_configured_by_the_taskmanager_memory_keys() -> None:
    conf = Configuration.load({"taskmanager.memory.process.size": "2 gb", "taskmanager.memory.watchdog.warn-ratio": "0.5",
                               "taskmanager.memory.watchdog.fail-ratio": "0.75",
                               "taskmanager.memory.task.off-heap.size": "300 mb"})
    dog = MemoryWatchdog.from_config("te", conf, enforce=True)
    assert (dog.limit, dog.warn_at, dog.fail_at, dog.arrow_limit) == (2048 * MB, 1024 * MB, 1536 * MB, 300 * MB)


def test_a_taskexecutors_memory_travels_in_its_slot_report() -> None:
    m = Measured()
    dog = m.watchdog(enforce=True)
    m.rss = 900 * MB
    dog.check()
    report = SlotReport.from_thrift(SlotReport([], 0, dog.status()).to_thrift())
    assert report.memory is not None and report.memory.level == "warning"
    assert (report.memory.used_bytes, report.memory.managed_total_bytes, report.memory.rocksdb_bytes) == (
        900 * MB, 250 * MB, 40 * MB)


# ---- the JobMaster: memory failures in a row fail the job ----------------------------------------

WATCHDOG = ErrorInfo("MemoryLimitError", "TaskExecutor te-0 uses 980 MB of its 1024 MB (taskmanager.memory.process.size)")
YARN_KILL = ErrorInfo("TaskExecutorLostError", "TaskExecutor te-1 was lost: container_1_0001_01_000002 failed: "
                      "Container [pid=4,containerID=container_1_0001_01_000002] is running 3B beyond the 'PHYSICAL' "
                      "memory limit. Current usage: 1.0 GB of 1 GB physical memory used. Killing container.")


def test_memory_failures_are_the_watchdogs_and_yarns_kills_for_memory() -> None:
    assert is_memory_failure(WATCHDOG) and is_memory_failure(YARN_KILL)
    assert not is_memory_failure(ErrorInfo("TaskExecutorLostError", "container failed: Exit code is 137"))
    assert not is_memory_failure(ErrorInfo("MemoryError", "a user's"))  # Python's own: the user's code failed


def fail_and_restart(d: Driver, error: ErrorInfo) -> None:
    [first, *rest] = d.current_deploys()
    d.report(first, S.FAILED, error)
    for x in rest:
        d.report(x, S.CANCELED)
    d.advance(0)
    d.offer_all()
    d.run_all(d.current_deploys())


def test_a_job_that_keeps_running_out_of_memory_fails_for_good_saying_so() -> None:
    d = Driver(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="100",
               restart_strategy_fixed_delay_delay="0 ms")
    d.start()
    d.run_all(d.of(DeployTask, d.offer_all()))
    fail_and_restart(d, WATCHDOG)
    fail_and_restart(d, ErrorInfo("ValueError", "a bad row"))  # another failure between does not count
    fail_and_restart(d, YARN_KILL)
    assert d.core.status == JobStatus.RUNNING and d.core.failures.restarts == 3
    [first, *_] = d.current_deploys()
    d.report(first, S.FAILED, WATCHDOG)  # the third
    assert d.core.status in (JobStatus.FAILING, JobStatus.FAILED)
    cause = d.core.failure_cause
    assert cause is not None and cause.error_class == "MemoryLimitError"
    assert "memory failure 3 in a row" in cause.message and "restart-strategy.max-memory-failures: 3" in cause.message
    assert "taskmanager.memory.process.size" in cause.message


def test_a_checkpoint_completed_between_memory_failures_starts_the_count_afresh() -> None:
    from yarnflow.am.jobmaster.failure_handler import FailureHandler

    handler = FailureHandler(None, None, None, max_memory_failures=2)  # type: ignore[arg-type]
    assert handler.memory_failure(WATCHDOG, checkpoint_id=4) is None
    assert handler.memory_failure(WATCHDOG, checkpoint_id=5) is None  # checkpoint 5 completed since
    assert handler.memory_failure(ErrorInfo("ValueError", "x"), checkpoint_id=5) is None
    final = handler.memory_failure(YARN_KILL, checkpoint_id=5)
    assert final is not None and "memory failure 2 in a row" in final.message
    unlimited = FailureHandler(None, None, None, max_memory_failures=0)  # type: ignore[arg-type]
    assert all(unlimited.memory_failure(WATCHDOG, 0) is None for _ in range(10))


def test_max_memory_failures_is_a_restart_strategy_key() -> None:
    assert max_memory_failures({}) == 3
    assert max_memory_failures({"restart-strategy.max-memory-failures": "0"}) == 0
    with pytest.raises(ConfigurationError, match="restart-strategy.max-memory-failures"):
        max_memory_failures({"restart-strategy.max-memory-failures": "-1"})


def test_a_local_clusters_slots_follow_taskmanager_number_of_task_slots_when_it_is_set() -> None:
    from yarnflow.local_cluster import LocalCluster

    # `yarnflow run -D taskmanager.numberOfTaskSlots=1` (the --slots default is 2): two
    # TaskExecutors of one slot each, not four started to keep 2 x 2 slots
    assert LocalCluster(2, 2, {"taskmanager.numberOfTaskSlots": "1"}).slots == 1
    assert LocalCluster(2, 3, {}).slots == 3
