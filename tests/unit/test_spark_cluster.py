"""The AppMaster's Spark standalone cluster (SparkCluster) driven by hand against fake daemons:
started on the first request, its workers once the master is up, dead workers replaced while it
is used, everything stopped after the idle timeout, a master that died before it was up
started again."""

from __future__ import annotations

import pytest

from yarnflow.am.resourcemanager.spark_cluster import SparkCluster, SparkClusterSettings, executor_memory_mb
from yarnflow.common.clock import ManualClock

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


class FakeDaemons:
    spark_in_containers = True

    def __init__(self) -> None:
        self.started: list[tuple[str, ...]] = []
        self.alive: set[str] = set()
        self.urls: dict[str, str] = {}

    def start_spark_master(self) -> str:
        handle = f"master-{len(self.started)}"
        self.started.append(("master", handle))
        self.alive.add(handle)
        return handle

    def spark_master_url(self, handle: str) -> str | None:
        return self.urls.get(handle)

    def start_spark_worker(self, master_url: str, memory_mb: int, cores: int) -> str:
        handle = f"worker-{len(self.started)}"
        self.started.append(("worker", handle, master_url, str(memory_mb), str(cores)))
        self.alive.add(handle)
        return handle

    def spark_daemon_alive(self, handle: str) -> bool:
        return handle in self.alive

    def stop_spark_daemon(self, handle: str) -> None:
        self.alive.discard(handle)


def cluster(idle_ms: int = 60_000) -> tuple[SparkCluster, FakeDaemons, ManualClock]:
    daemons, clock = FakeDaemons(), ManualClock(0)
    return SparkCluster(daemons, clock, {"spark.executor.memory": "512m"}, idle_ms), daemons, clock


def test_the_master_then_its_workers_are_started_by_requests() -> None:
    c, d, clock = cluster()
    assert c.request({"spark.executor.instances": "3", "spark.executor.cores": "2"}) == ""
    assert d.started == [("master", "master-0")]
    assert c.request({}) == ""  # not up yet: asked again, nothing more is started
    d.urls["master-0"] = "spark://h:7077"
    assert c.request({}) == "spark://h:7077"
    workers = [s for s in d.started if s[0] == "worker"]
    assert workers == [("worker", f"worker-{i}", "spark://h:7077", "512", "2") for i in (1, 2, 3)]
    assert c.request({"spark.executor.instances": "9"}) == "spark://h:7077"  # the running cluster is shared
    assert len([s for s in d.started if s[0] == "worker"]) == 3


def test_a_dead_worker_is_replaced_while_the_cluster_is_used() -> None:
    c, d, clock = cluster()
    c.request({})
    d.urls["master-0"] = "spark://h:7077"
    c.request({})
    d.alive.discard("worker-1")  # its container was killed
    clock.advance(1000)
    c.check()
    assert c.replaced == 1 and len(c.workers) == 2 and "worker-1" not in c.workers
    assert all(d.spark_daemon_alive(w) for w in c.workers)


def test_an_idle_cluster_is_stopped_and_started_again_on_demand() -> None:
    c, d, clock = cluster(idle_ms=5000)
    c.request({})
    d.urls["master-0"] = "spark://h:7077"
    c.request({})
    clock.advance(4000)
    c.check()
    assert c.running
    clock.advance(1000)
    c.check()
    assert not c.running and d.alive == set()
    assert c.request({}) == "" and d.started[-1] == ("master", "master-3")


def test_a_master_that_dies_before_it_is_up_is_started_again() -> None:
    c, d, clock = cluster()
    c.request({})
    d.alive.discard("master-0")
    assert c.request({}) == ""
    assert c.master == "master-1"


def test_settings_and_memory_strings() -> None:
    assert SparkClusterSettings.of({}, 1) == SparkClusterSettings(2, 1, 1024, 1)
    assert [executor_memory_mb(v) for v in ("512m", "2g", "1536", "1.5g")] == [512, 2048, 1536, 1536]
    with pytest.raises(ValueError, match="bad Spark executor setting"):
        SparkClusterSettings.of({"spark.executor.instances": "many"}, 1)
