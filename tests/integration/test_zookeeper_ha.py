"""ZooKeeperHaServices against a real ZooKeeper server (tests/zookeeper.py): leader election and
takeover, fencing of a deposed leader, connection loss and a ZooKeeper restart, the stores, the
cluster-shutdown marker, and bad or unreachable settings."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import wait_until
from tests.zookeeper import SESSION_TIMEOUT_S, ZooKeeperChroot
from yarnflow.common.config import Configuration
from yarnflow.common.errors import (
    ConfigurationError,
    CoordinationUnavailableError,
    HighAvailabilityError,
    NotFoundError,
    NotLeaderError,
)
from yarnflow.common.ha.api import JobResultEntry, LeaderInformation
from yarnflow.common.ha.zookeeper import ZooKeeperHaServices
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import ErrorInfo, JobEdge, JobGraph, JobResult, JobVertex, Partitioner
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Contender:
    """A LeaderContender that records what it is told and, like the AppMaster, confirms every
    grant with its address."""

    def __init__(self, name: str, services: ZooKeeperHaServices) -> None:
        self.name = name
        self.address = f"{name}.example:6123"
        self.services = services
        self.election = services.leader_election()
        self.events: list[tuple[str, str]] = []
        self.session_id: str | None = None
        self.revoked_at: float | None = None  # time.monotonic() of the last revoke
        self._lock = threading.Lock()

    def start(self) -> Contender:
        self.election.start(self)
        return self

    def grant_leadership(self, session_id: str) -> None:
        with self._lock:
            self.events.append(("grant", session_id))
            self.session_id = session_id
        self.election.confirm_leadership(session_id, self.address)

    def revoke_leadership(self) -> None:
        with self._lock:
            self.events.append(("revoke", self.session_id or ""))
            self.session_id = None
            self.revoked_at = time.monotonic()

    def grants(self) -> list[str]:
        return [sid for kind, sid in self.events if kind == "grant"]

    def leader_info(self) -> LeaderInformation:
        assert self.session_id is not None, f"{self.name} does not lead"
        return LeaderInformation(self.address, self.session_id)


class Recorder:
    """A retrieval listener: every value it gets, in order."""

    def __init__(self) -> None:
        self.values: list[LeaderInformation | None] = []

    def __call__(self, leader: LeaderInformation | None) -> None:
        self.values.append(leader)


def leaders(contenders: list[Contender]) -> list[Contender]:
    return [c for c in contenders if c.session_id is not None]


def published(chroot: ZooKeeperChroot) -> LeaderInformation | None:
    """What the address node says, read by a client of its own."""
    node = f"{chroot.base}/leader/address"
    if not chroot.admin.exists(node):
        return None
    value = json.loads(chroot.admin.get(node)[0])
    return LeaderInformation(value["address"], value["session_id"])


def wait_for_leader(chroot: ZooKeeperChroot, contenders: list[Contender], timeout: float) -> Contender:
    """The one contender that leads and is published in ZooKeeper."""
    def one() -> Contender | None:
        current = leaders(contenders)
        if len(current) == 1 and published(chroot) == current[0].leader_info():
            return current[0]
        return None
    return wait_until(one, timeout, lambda: f"no single published leader: {[(c.name, c.events) for c in contenders]}, "
                                            f"address node {published(chroot)}")


def job_graph(job_id: str = "job-1", name: str = "wordcount") -> JobGraph:
    vertices = [JobVertex(JobVertexID("src"), "source", 2, 8, is_source=True),
                JobVertex(JobVertexID("snk"), "sink", 2, 8, is_sink=True)]
    return JobGraph(JobID(job_id), name, vertices, [JobEdge(JobVertexID("src"), JobVertexID("snk"), Partitioner.HASH,
                                                            key_columns=["k"])],
                    artifact_uri="file:///jobs/wordcount.zip", config={"parallelism.default": "2"})


def job_result(job_id: str = "job-1", status: JobStatus = JobStatus.FINISHED) -> JobResult:
    cause = ErrorInfo("ValueError", "bad row", "Traceback ...") if status == JobStatus.FAILED else None
    return JobResult(JobID(job_id), status, 1_000, 2_000, failure_cause=cause, collected={"out": ["a", "b"]})


def a_leader(chroot: ZooKeeperChroot, name: str = "am-1") -> Contender:
    contender = Contender(name, chroot.services()).start()
    wait_for_leader(chroot, [contender], 10)
    return contender


def stores_tree(chroot: ZooKeeperChroot) -> dict[str, bytes]:
    """The chroot's nodes but the election's."""
    return {path: data for path, data in chroot.tree().items() if not path.startswith(f"{chroot.base}/leader")}


def blob_files(chroot: ZooKeeperChroot) -> list[str]:
    directory = chroot.storage_dir.removeprefix("file://") + "/jobgraphs"
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# -- election and retrieval --------------------------------------------------------------------

def test_one_of_three_contenders_leads_and_another_takes_over_when_its_services_close(
        zk_chroot: ZooKeeperChroot) -> None:
    follower = Recorder()
    zk_chroot.services().leader_retrieval().start(follower)
    contenders = [Contender(f"am-{i}", zk_chroot.services()).start() for i in range(3)]
    first = wait_for_leader(zk_chroot, contenders, 10)
    wait_until(lambda: len(zk_chroot.admin.get_children(f"{zk_chroot.base}/leader/latch")) == 3, 10,
               "not every contender joined the election")
    assert [c.grants() for c in contenders if c is not first] == [[], []]
    assert first.election.has_leadership(first.grants()[0])
    wait_until(lambda: follower.values and follower.values[-1] == first.leader_info(), 10,
               lambda: f"the follower did not learn the leader: {follower.values}")

    first_info = first.leader_info()
    first.services.close()
    rest = [c for c in contenders if c is not first]
    second = wait_for_leader(zk_chroot, rest, SESSION_TIMEOUT_S)
    assert [c.grants() for c in rest if c is not second] == [[]]
    assert first.events == [("grant", first_info.session_id)]  # closing revokes nothing
    assert second.session_id != first_info.session_id
    wait_until(lambda: follower.values[-1] == second.leader_info(), 10,
               lambda: f"the follower did not follow the new leader: {follower.values}")
    assert follower.values[0] is None  # no leader when it started
    assert [v for v in follower.values if v is not None] == [first_info, second.leader_info()]
    assert all(a != b for a, b in zip(follower.values, follower.values[1:])), "a value was repeated"


def test_when_the_leaders_session_expires_another_takes_over_and_the_old_one_is_revoked(
        zk_chroot: ZooKeeperChroot) -> None:
    follower = Recorder()
    zk_chroot.services().leader_retrieval().start(follower)
    contenders = [Contender(f"am-{i}", zk_chroot.services()).start() for i in range(3)]
    first = wait_for_leader(zk_chroot, contenders, 10)
    first_info = first.leader_info()

    zk_chroot.expire_session(first.services)
    second = wait_for_leader(zk_chroot, [c for c in contenders if c is not first], SESSION_TIMEOUT_S)
    wait_until(lambda: first.events == [("grant", first_info.session_id), ("revoke", first_info.session_id)], 5,
               lambda: f"the old leader was not revoked: {first.events}")
    assert not first.election.has_leadership(first_info.session_id)
    wait_until(lambda: follower.values[-1] == second.leader_info(), 10, lambda: f"not followed: {follower.values}")
    assert [v for v in follower.values if v is not None] == [first_info, second.leader_info()]
    # with a new session, the old leader is a contender again, behind the new one
    wait_until(lambda: len(zk_chroot.admin.get_children(f"{zk_chroot.base}/leader/latch")) == 3, 10,
               "the old leader did not rejoin the election")
    assert leaders(contenders) == [second]


def test_a_retrieval_gets_the_current_leader_first_and_then_only_changes(zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    follower = Recorder()
    retrieval = zk_chroot.services().leader_retrieval()
    retrieval.start(follower)
    wait_until(lambda: follower.values == [leader.leader_info()], 10, lambda: f"got {follower.values}")
    leader.election.confirm_leadership(leader.grants()[0], leader.address)  # the same value again
    leader.election.confirm_leadership(leader.grants()[0], "moved.example:7000")
    moved = LeaderInformation("moved.example:7000", leader.grants()[0])
    wait_until(lambda: follower.values == [leader.leader_info(), moved], 10, lambda: f"got {follower.values}")

    retrieval.stop()
    leader.election.confirm_leadership(leader.grants()[0], "again.example:7001")
    wait_until(lambda: published(zk_chroot) == LeaderInformation("again.example:7001", leader.grants()[0]), 10,
               "the address was not published")
    later = Recorder()
    zk_chroot.services().leader_retrieval().start(later)
    wait_until(lambda: later.values == [published(zk_chroot)], 10, lambda: f"got {later.values}")
    assert follower.values == [leader.leader_info(), moved]  # nothing after its stop


# -- fencing -----------------------------------------------------------------------------------

def every_write(services: ZooKeeperHaServices) -> dict[str, Callable[[], Any]]:
    graphs, results = services.job_graph_store(), services.job_result_store()
    checkpoints, counter = services.checkpoint_store("job-1"), services.checkpoint_id_counter("job-1")
    return {
        "JobGraphStore.put": lambda: graphs.put(job_graph("job-1", name="changed")),
        "JobGraphStore.put (new job)": lambda: graphs.put(job_graph("job-9")),
        "JobGraphStore.remove": lambda: graphs.remove("job-1"),
        "JobGraphStore.remove (unknown job)": lambda: graphs.remove("job-9"),
        "CompletedCheckpointStore.add": lambda: checkpoints.add(3, "file:///chk-3/_metadata"),
        "CompletedCheckpointStore.remove": lambda: checkpoints.remove(1),
        "CompletedCheckpointStore.clear": checkpoints.clear,
        "CheckpointIDCounter.get_and_increment": counter.get_and_increment,
        "CheckpointIDCounter.remove": counter.remove,
        "JobResultStore.put": lambda: results.put(JobResultEntry(job_result("job-1", JobStatus.FAILED), 5)),
        "JobResultStore.mark_fetched": lambda: results.mark_fetched("job-1"),
        "JobResultStore.remove": lambda: results.remove("job-1"),
        "request_cluster_shutdown": services.request_cluster_shutdown,
    }


def fill_stores(services: ZooKeeperHaServices) -> None:
    services.job_graph_store().put(job_graph("job-1"))
    services.checkpoint_store("job-1").add(1, "file:///chk-1/_metadata")
    services.checkpoint_store("job-1").add(2, "file:///chk-2/_metadata")
    assert services.checkpoint_id_counter("job-1").get_and_increment() == 1
    services.job_result_store().put(JobResultEntry(job_result("job-1"), 1234))


def assert_every_write_refused(services: ZooKeeperHaServices) -> None:
    for name, write in every_write(services).items():
        with pytest.raises(NotLeaderError):
            write()
            pytest.fail(f"{name} was accepted")


def test_a_leader_whose_session_expired_can_change_nothing(zk_chroot: ZooKeeperChroot) -> None:
    old = a_leader(zk_chroot, "old")
    old_session = old.grants()[0]
    fill_stores(old.services)
    new = Contender("new", zk_chroot.services()).start()
    zk_chroot.expire_session(old.services)
    wait_for_leader(zk_chroot, [old, new], SESSION_TIMEOUT_S)
    assert new.session_id is not None and old.session_id is None
    assert not old.election.has_leadership(old_session)
    # with a new session it contends again (waiting behind the new leader)
    wait_until(lambda: len(zk_chroot.admin.get_children(f"{zk_chroot.base}/leader/latch")) == 2, 10,
               "the old leader did not rejoin the election")

    before, files = zk_chroot.tree(), blob_files(zk_chroot)
    assert_every_write_refused(old.services)
    old.election.confirm_leadership(old_session, "old.example:1")  # not the leader: nothing happens
    assert zk_chroot.tree() == before
    assert blob_files(zk_chroot) == files
    assert published(zk_chroot) == new.leader_info()
    assert old.services.job_graph_store().get("job-1") == job_graph("job-1")  # reads are not fenced


def test_a_write_of_a_leader_whose_latch_node_is_gone_is_refused_and_ends_its_leadership(
        zk_chroot: ZooKeeperChroot) -> None:
    """What a leader paused past its session timeout meets: ZooKeeper has dropped its latch node
    before its client noticed anything. The fencing check in ZooKeeper refuses the write."""
    leader = a_leader(zk_chroot)
    session = leader.grants()[0]
    fill_stores(leader.services)
    latch = f"{zk_chroot.base}/leader/latch"
    for node in zk_chroot.admin.get_children(latch):
        zk_chroot.admin.delete(f"{latch}/{node}")
    assert not leader.election.has_leadership(session)

    before = stores_tree(zk_chroot)
    with pytest.raises(NotLeaderError, match="no longer leads"):
        leader.services.checkpoint_store("job-1").add(3, "file:///chk-3/_metadata")
    assert stores_tree(zk_chroot) == before
    wait_until(lambda: ("revoke", session) in leader.events, 5, lambda: f"not revoked: {leader.events}")
    # alone in the election, it contends again and leads under a new session id
    wait_until(lambda: len(leader.grants()) == 2, 10, lambda: f"not granted again: {leader.events}")
    assert leader.grants()[1] != session
    assert leader.services.checkpoint_store("job-1").checkpoints() == [
        (1, "file:///chk-1/_metadata"), (2, "file:///chk-2/_metadata")]


def test_a_process_that_does_not_contend_reads_the_stores_but_cannot_write(zk_chroot: ZooKeeperChroot) -> None:
    fill_stores(a_leader(zk_chroot).services)
    reader = zk_chroot.services()
    before = zk_chroot.tree()
    assert_every_write_refused(reader)
    assert zk_chroot.tree() == before
    assert reader.job_graph_store().job_ids() == ["job-1"]
    assert reader.checkpoint_id_counter("job-1").current() == 2
    assert not reader.cluster_shut_down()


# -- connection loss and ZooKeeper restarts -----------------------------------------------------

def test_stopping_zookeeper_revokes_at_once_and_after_a_restart_the_leadership_and_the_data_are_back(
        zk_chroot: ZooKeeperChroot) -> None:
    contenders = [Contender(f"am-{i}", zk_chroot.services()).start() for i in range(2)]
    first = wait_for_leader(zk_chroot, contenders, 10)
    session = first.grants()[0]
    fill_stores(first.services)
    reader = zk_chroot.services()

    zk_chroot.server.stop()
    # well within the session timeout: on SUSPENDED, not at the session's end
    wait_until(lambda: ("revoke", session) in first.events, 0.75 * SESSION_TIMEOUT_S,
               lambda: f"no revoke while ZooKeeper is down: {first.events}")
    assert not first.election.has_leadership(session)
    with pytest.raises(NotLeaderError):
        first.services.job_result_store().remove("job-1")

    zk_chroot.server.start()
    leader = wait_for_leader(zk_chroot, contenders, 15)
    assert leader.session_id != session
    for services in (leader.services, reader):
        assert services.job_graph_store().get("job-1") == job_graph("job-1")
        assert services.checkpoint_store("job-1").checkpoints() == [
            (1, "file:///chk-1/_metadata"), (2, "file:///chk-2/_metadata")]
        assert services.checkpoint_id_counter("job-1").current() == 2
        assert services.job_result_store().get("job-1") == JobResultEntry(job_result("job-1"), 1234)
    assert leader.services.checkpoint_id_counter("job-1").get_and_increment() == 2


TOLERATE_SUSPENDED = {"high-availability.zookeeper.client.tolerate-suspended-connections": "true"}


def test_a_dropped_connection_revokes_and_then_grants_again(zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    session = leader.grants()[0]
    zk_chroot.drop_connection(leader.services)
    wait_until(lambda: len(leader.grants()) == 2, 10, lambda: f"not granted again: {leader.events}")
    assert leader.events[:2] == [("grant", session), ("revoke", session)]
    assert leader.grants()[1] != session and not leader.election.has_leadership(session)
    wait_for_leader(zk_chroot, [leader], 10)


def test_with_tolerate_suspended_connections_a_dropped_connection_keeps_the_leadership(
        zk_chroot: ZooKeeperChroot) -> None:
    leader = Contender("am", zk_chroot.services(zk_chroot.conf(TOLERATE_SUSPENDED))).start()
    wait_for_leader(zk_chroot, [leader], 10)
    session = leader.grants()[0]
    zk_chroot.drop_connection(leader.services)
    assert leader.election.has_leadership(session)
    leader.services.checkpoint_store("job-1").add(1, "file:///chk-1/_metadata")
    assert leader.events == [("grant", session)]


def test_with_tolerate_suspended_connections_an_outage_longer_than_the_session_timeout_revokes(
        zk_chroot: ZooKeeperChroot) -> None:
    leader = Contender("am", zk_chroot.services(zk_chroot.conf(TOLERATE_SUSPENDED))).start()
    wait_for_leader(zk_chroot, [leader], 10)
    session = leader.grants()[0]
    stopping_at = time.monotonic()  # the connection cannot be suspended before this
    zk_chroot.server.stop()
    wait_until(lambda: leader.revoked_at is not None, SESSION_TIMEOUT_S + 2, lambda: f"not revoked: {leader.events}")
    assert leader.revoked_at is not None and leader.revoked_at - stopping_at >= SESSION_TIMEOUT_S
    assert leader.events == [("grant", session), ("revoke", session)]
    zk_chroot.server.start()
    wait_for_leader(zk_chroot, [leader], 15)
    assert leader.grants()[1] != session


# -- stores ------------------------------------------------------------------------------------

def test_job_graph_store_round_trip(zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    store, reader = leader.services.job_graph_store(), zk_chroot.services().job_graph_store()
    assert store.job_ids() == []
    with pytest.raises(NotFoundError, match="job-1"):
        reader.get("job-1")
    store.put(job_graph("job-1"))
    store.put(job_graph("job-2", name="second"))
    assert reader.job_ids() == ["job-1", "job-2"]
    assert reader.get("job-1") == job_graph("job-1")
    assert len(blob_files(zk_chroot)) == 2
    pointer = json.loads(zk_chroot.admin.get(f"{zk_chroot.base}/jobgraphs/job-1")[0])
    assert pointer["path"].startswith(f"{zk_chroot.storage_dir}/jobgraphs/")

    store.put(job_graph("job-1", name="replaced"))
    assert reader.get("job-1").name == "replaced"
    assert len(blob_files(zk_chroot)) == 2  # the replaced file is gone
    store.remove("job-1")
    store.remove("job-1")  # unknown by now: nothing happens
    assert reader.job_ids() == ["job-2"]
    assert len(blob_files(zk_chroot)) == 1
    with pytest.raises(NotFoundError):
        reader.get("job-1")


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_job_graph_whose_file_is_missing_or_corrupt_gives_a_clear_error(
        zk_chroot: ZooKeeperChroot, damage: str) -> None:
    leader = a_leader(zk_chroot)
    leader.services.job_graph_store().put(job_graph("job-1"))
    url = json.loads(zk_chroot.admin.get(f"{zk_chroot.base}/jobgraphs/job-1")[0])["path"]
    local = url.removeprefix("file://")
    if damage == "missing":
        os.remove(local)
    else:
        with open(local, "wb") as fh:
            fh.write(b"\xff not a JobGraph")
    with pytest.raises(HighAvailabilityError, match=damage) as info:
        zk_chroot.services().job_graph_store().get("job-1")
    assert url in str(info.value)
    assert not isinstance(info.value, NotFoundError)


def test_completed_checkpoint_store_keeps_pointers_oldest_first(zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    store, reader = leader.services.checkpoint_store("job-1"), zk_chroot.services().checkpoint_store("job-1")
    assert reader.checkpoints() == []
    for n in (10, 9, 100, 2):
        store.add(n, f"file:///chk/{n}/_metadata")
    assert reader.checkpoints() == [(n, f"file:///chk/{n}/_metadata") for n in (2, 9, 10, 100)]
    assert sorted(zk_chroot.admin.get_children(f"{zk_chroot.base}/checkpoints/job-1"))[0] == "0000000000000000002"
    store.remove(9)
    store.remove(9)
    assert reader.checkpoints() == [(2, "file:///chk/2/_metadata"), (10, "file:///chk/10/_metadata"),
                                    (100, "file:///chk/100/_metadata")]
    leader.services.checkpoint_store("job-2").add(1, "file:///other/_metadata")
    store.clear()
    assert reader.checkpoints() == []
    assert leader.services.checkpoint_store("job-2").checkpoints() == [(1, "file:///other/_metadata")]


def test_checkpoint_ids_start_at_one_and_continue_without_repeats_after_the_leader_changes(
        zk_chroot: ZooKeeperChroot) -> None:
    contenders = [Contender(f"am-{i}", zk_chroot.services()).start() for i in range(2)]
    first = wait_for_leader(zk_chroot, contenders, 10)
    counter = first.services.checkpoint_id_counter("job-1")
    assert counter.current() == 1
    taken = [counter.get_and_increment() for _ in range(3)]
    assert taken == [1, 2, 3] and counter.current() == 4
    threads_taken: list[int] = []
    workers = [threading.Thread(target=lambda: threads_taken.append(counter.get_and_increment())) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(20)
    assert sorted(threads_taken) == [4, 5, 6, 7]

    first.services.close()
    second = wait_for_leader(zk_chroot, [c for c in contenders if c is not first], SESSION_TIMEOUT_S)
    counter = second.services.checkpoint_id_counter("job-1")
    assert [counter.get_and_increment() for _ in range(2)] == [8, 9]
    counter.remove()
    assert counter.current() == 1
    assert second.services.checkpoint_id_counter("job-2").get_and_increment() == 1


def test_job_result_store_round_trip(zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    store, reader = leader.services.job_result_store(), zk_chroot.services().job_result_store()
    assert reader.get("job-1") is None and reader.job_ids() == []
    finished = JobResultEntry(job_result("job-1"), 1234, extra={"name": "wordcount"})
    failed = JobResultEntry(job_result("job-2", JobStatus.FAILED), 5678)
    store.put(finished)
    store.put(failed)
    assert reader.job_ids() == ["job-1", "job-2"]
    assert reader.get("job-1") == finished
    assert reader.get("job-2") == failed
    store.mark_fetched("job-2")
    store.mark_fetched("job-3")  # unknown: nothing happens
    assert reader.get("job-2") == JobResultEntry(failed.result, 5678, fetched=True)
    store.remove("job-1")
    store.remove("job-1")
    assert reader.job_ids() == ["job-2"]
    zk_chroot.admin.set(f"{zk_chroot.base}/job-results/job-2", b"{not json")
    with pytest.raises(HighAvailabilityError, match="job-results/job-2"):
        reader.get("job-2")


# -- cluster shutdown --------------------------------------------------------------------------

def test_the_cluster_shutdown_marker_reaches_the_callback_of_another_process_once(
        zk_chroot: ZooKeeperChroot) -> None:
    leader = a_leader(zk_chroot)
    standby = zk_chroot.services()
    calls: list[str] = []
    standby.on_cluster_shutdown(lambda: calls.append(threading.current_thread().name))
    assert not standby.cluster_shut_down()
    with pytest.raises(NotLeaderError):
        standby.request_cluster_shutdown()
    assert calls == []

    leader.services.request_cluster_shutdown()
    leader.services.request_cluster_shutdown()  # marked already: nothing more happens
    wait_until(lambda: calls, 10, "the standby's callback was not called")
    assert standby.cluster_shut_down()
    late: list[bool] = []
    standby.on_cluster_shutdown(lambda: late.append(True))  # registered after the fact: called at once
    wait_until(lambda: late == [True], 10, "a callback registered after the shutdown was not called")
    assert len(calls) == 1 and calls[0].startswith("ha-callbacks")


# -- settings, connection and close ------------------------------------------------------------

def test_an_unreachable_quorum_raises_within_the_connection_timeout_and_leaves_no_thread(
        zk_chroot: ZooKeeperChroot) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it
    before = set(threading.enumerate())
    config = zk_chroot.conf({"high-availability.zookeeper.quorum": f"127.0.0.1:{port}",
                             "high-availability.zookeeper.client.connection-timeout": "1 s"})
    started = time.monotonic()
    with pytest.raises(CoordinationUnavailableError) as info:
        ZooKeeperHaServices(config)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 3.0, f"gave up after {elapsed:.1f} s, not about the connection timeout of 1 s"
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "1000 ms" in message and "\n" not in message
    def left() -> set[threading.Thread]:  # timers of other tests' in-process components may come and go
        return {t for t in set(threading.enumerate()) - before if not isinstance(t, threading.Timer)}

    wait_until(lambda: not left(), 5, lambda: f"threads left behind: {left()}")


@pytest.mark.parametrize(("key", "value"), [
    ("high-availability.zookeeper.quorum", ""),
    ("high-availability.zookeeper.quorum", "  "),
    ("high-availability.storageDir", ""),
])
def test_incomplete_settings_are_refused_naming_the_key(key: str, value: str) -> None:
    config = Configuration.load({"high-availability.type": "zookeeper",
                                 "high-availability.zookeeper.quorum": "127.0.0.1:2181",
                                 "high-availability.storageDir": "file:///tmp/ha", key: value})
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        ZooKeeperHaServices(config)


def test_close_ends_the_leadership_and_every_thread_and_is_idempotent(zk_chroot: ZooKeeperChroot) -> None:
    before = set(threading.enumerate())
    services = zk_chroot.services()  # closed again at teardown: close is idempotent
    contender = Contender("am", services).start()
    wait_for_leader(zk_chroot, [contender], 10)
    services.leader_retrieval().start(Recorder())
    services.on_cluster_shutdown(lambda: None)
    assert set(threading.enumerate()) - before

    services.close()
    services.close()
    assert published(zk_chroot) is None
    assert zk_chroot.admin.get_children(f"{zk_chroot.base}/leader/latch") == []
    assert contender.events == [("grant", contender.grants()[0])]
    wait_until(lambda: not (set(threading.enumerate()) - before), 5,
               lambda: f"threads left running: {set(threading.enumerate()) - before}")
    with pytest.raises(NotLeaderError):
        services.job_graph_store().put(job_graph())
    with pytest.raises(CoordinationUnavailableError):
        services.job_graph_store().job_ids()
