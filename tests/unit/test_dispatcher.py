"""The Dispatcher on its own, its collaborators injected (JobMasters from a factory, the RPC
server that serves them, in-memory high-availability stores): submit, cancel, results,
recovery by a new leader, losing the leadership, and fencing; and its one concurrency model:
every call runs on its main thread, and what waits (a result, a savepoint) waits as a Future,
never holding that thread."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.harness import wait_until

from yarnflow.am.dispatcher.dispatcher import Dispatcher
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.common.config import Configuration
from yarnflow.common.errors import (
    FencingTokenError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderRpcError,
    RefusedError,
    UnavailableError,
)
from yarnflow.common.ha import EmbeddedHaServices, JobResultEntry
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobGraph, JobResult, JobStatusInfo, JobVertex
from yarnflow.common.rpc.gateways import job_master_service
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

TOKEN = "leader-1"


class FakeJobMaster:
    """What the Dispatcher needs of a JobMaster; the test ends its job by hand."""

    def __init__(self, job_graph: JobGraph, recover: bool, on_terminal: Callable[[Any], None]) -> None:
        self.job_graph, self.job_id, self.recover = job_graph, job_graph.job_id, recover
        self._on_terminal = on_terminal
        self.handler = object()
        self.started = self.stopped = False
        self.status = JobStatus.CREATED
        self.result: JobResult | None = None
        self.savepoints: list[tuple[str, str]] = []
        #: what trigger_savepoint answers next (settled at once unless a test holds it)
        self.savepoint_answer: Future[str] | None = None
        self.checkpoints_asked = 0
        #: what trigger_checkpoint answers next (settled at once unless a test holds it)
        self.checkpoint_answer: Future[str] | None = None

    def start(self) -> None:
        self.started = True
        self.status = JobStatus.RUNNING

    def end(self, status: JobStatus) -> None:
        self.status = status
        self.result = JobResult(self.job_id, status, 1, 2)
        self._on_terminal(self)

    def cancel(self) -> None:
        self.end(JobStatus.CANCELED)

    def suspend(self, reason: str) -> None:
        self.end(JobStatus.SUSPENDED)

    def trigger_checkpoint(self) -> Future[str]:
        self.checkpoints_asked += 1
        answer = self.checkpoint_answer or Future()
        if self.checkpoint_answer is None:
            answer.set_result(f"memory://checkpoints/{self.job_id}/chk-1/_metadata")
        return answer

    def trigger_savepoint(self, target_dir: str, stop: str = "") -> Future[str]:
        self.savepoints.append((target_dir, stop))
        answer = self.savepoint_answer or Future()
        if self.savepoint_answer is None:
            answer.set_result(f"{target_dir}/savepoint-1")
        return answer

    def status_info(self) -> JobStatusInfo:
        return JobStatusInfo(self.job_id, self.job_graph.name, self.status, 1, 0)

    @property
    def checkpoint_dir(self) -> str:
        return f"memory://checkpoints/{self.job_id}"

    def checkpoints_to_delete(self) -> str | None:
        return None

    status_info_on_main_thread = status_info

    def kept_checkpoint_subtasks_on_main_thread(self) -> dict[int, Any]:
        return {}

    def stop(self) -> None:
        self.stopped = True


class FakeServer:
    def __init__(self) -> None:
        self.services: dict[str, object] = {}

    def register(self, service: str, processor: object) -> None:
        self.services[service] = processor

    def unregister(self, service: str, processor: object) -> None:
        if self.services.get(service) is processor:
            del self.services[service]


class FakeResourceManager:
    def overview(self) -> tuple[int, int, int]:
        return 1, 4, 2


class Bed:
    def __init__(self, tmp_path: Path, ha: EmbeddedHaServices | None = None) -> None:
        self.ha = ha or EmbeddedHaServices()
        self.server = FakeServer()
        self.masters: dict[str, FakeJobMaster] = {}
        self.leading = True
        self.artifact = tmp_path / "job.zip"
        self.artifact.write_bytes(b"a job")
        self.shutdowns = threading.Event()

        def new_job_master(job_graph: JobGraph, recover: bool, on_terminal: Callable[[Any], None]) -> Any:
            jm = self.masters[str(job_graph.job_id)] = FakeJobMaster(job_graph, recover, on_terminal)
            return jm

        self.d = Dispatcher(Configuration.load({}), FakeResourceManager(), "c",  # type: ignore[arg-type]
                            (tmp_path / "storage").as_uri(),
                            "local", self.shutdowns.set, ArtifactCache(str(tmp_path / "artifacts")), ha=self.ha,
                            fencing_token=TOKEN, is_leader=lambda: self.leading, rpc_server=self.server,  # type: ignore[arg-type]
                            job_master_factory=new_job_master)

    def graph(self, job_id: str, name: str = "etl") -> JobGraph:
        return JobGraph(JobID(job_id), name, [JobVertex(JobVertexID("v"), "v", 1, 128, ["v"], is_source=True)], [],
                        artifact_uri=self.artifact.as_uri())

    def call(self, method: str, *args: Any, token: str = TOKEN) -> Any:
        return self.d.rpc_invoke(method, token, args)


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    bed = Bed(tmp_path)
    yield bed
    bed.d.stop(grace_s=0)


def on_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` on a thread of its own; its outcome (result or error) lands in the list."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(fn())
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def test_a_submitted_job_is_stored_started_and_served(bed: Bed) -> None:
    job_id = bed.call("submit_job", bed.graph("j1"))
    jm = bed.masters["j1"]
    assert job_id == "j1" and jm.started and not jm.recover
    assert bed.ha.job_graph_store().job_ids() == ["j1"]  # stored before it started
    assert bed.server.services == {job_master_service("j1"): jm.handler}  # TaskExecutors call it directly
    assert [(j.job_id, j.status) for j in bed.call("list_jobs")] == [("j1", JobStatus.RUNNING)]
    assert bed.call("get_job", JobID("j1")).name == "etl"


def test_a_job_is_refused_twice_and_without_its_artifact(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    with pytest.raises(RefusedError, match="already submitted"):
        bed.call("submit_job", bed.graph("j1"))
    missing = dataclasses.replace(bed.graph("j2"), artifact_uri=bed.artifact.with_name("gone.zip").as_uri())
    with pytest.raises(InvalidRequestError, match="does not exist"):
        bed.call("submit_job", missing)
    assert "j2" not in bed.masters and bed.ha.job_graph_store().job_ids() == ["j1"]


def test_cancel_ends_the_job_its_result_is_kept_until_fetched_and_its_service_goes(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    with pytest.raises(UnavailableError, match="still running"):
        bed.call("request_job_result", JobID("j1"), 10)
    bed.call("cancel_job", JobID("j1"))
    assert bed.server.services == {}
    assert bed.ha.job_graph_store().job_ids() == []  # the result is what a new leader reads now
    assert bed.ha.job_result_store().get("j1") is not None
    assert bed.call("request_job_result", JobID("j1"), 10).status == JobStatus.CANCELED
    assert bed.ha.job_result_store().get("j1") is None  # fetched: dropped from the store
    assert bed.call("get_job", JobID("j1")).status == JobStatus.CANCELED  # still answered here
    with pytest.raises(RefusedError, match="already ended CANCELED"):
        bed.call("cancel_job", JobID("j1"))


def test_a_client_waiting_for_a_result_gets_it_when_the_job_ends(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    got: list[JobResult] = []
    waiter = threading.Thread(target=lambda: got.append(bed.call("request_job_result", JobID("j1"), 10_000)))
    waiter.start()
    bed.masters["j1"].end(JobStatus.FINISHED)
    waiter.join(5)
    assert [r.status for r in got] == [JobStatus.FINISHED]


def test_unknown_jobs_are_not_found(bed: Bed) -> None:
    for method, args in (("get_job", ()), ("cancel_job", ()), ("request_job_result", (10,)),
                         ("trigger_savepoint", ("file:///sp",))):
        with pytest.raises(NotFoundError):
            bed.call(method, JobID("nope"), *args)


def test_a_savepoint_goes_to_the_named_folder_or_is_refused_without_one(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    assert bed.call("trigger_savepoint", JobID("j1"), "file:///sp") == "file:///sp/savepoint-1"
    assert bed.call("stop_with_savepoint", JobID("j1"), "file:///sp", True) == "file:///sp/savepoint-1"
    assert bed.masters["j1"].savepoints == [("file:///sp", ""), ("file:///sp", "drain")]
    with pytest.raises(InvalidRequestError, match="state.savepoints.dir"):
        bed.call("trigger_savepoint", JobID("j1"), "")


def test_a_new_leader_resumes_stored_jobs_without_a_result_and_keeps_the_others_ended(tmp_path: Path) -> None:
    ha = EmbeddedHaServices()
    first = Bed(tmp_path, ha)
    ha.job_graph_store().put(first.graph("running"))
    ha.job_graph_store().put(first.graph("ended"))
    ha.job_result_store().put(JobResultEntry(JobResult(JobID("ended"), JobStatus.FINISHED, 1, 2), 5))
    bed = Bed(tmp_path, ha)
    assert bed.d.recover_jobs() == ["running"]
    assert bed.masters["running"].recover and bed.masters["running"].started
    assert "ended" not in bed.masters
    assert ha.job_graph_store().job_ids() == ["running"]  # the ended job's leftovers are cleaned up
    assert bed.call("get_job", JobID("ended")).status == JobStatus.FINISHED
    assert set(bed.server.services) == {job_master_service("running")}


def test_losing_the_leadership_suspends_every_job_and_writes_nothing(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    bed.leading = False
    bed.d.suspend_all("lost the leadership")
    assert bed.masters["j1"].status == JobStatus.SUSPENDED
    assert bed.server.services == {}
    assert bed.ha.job_result_store().get("j1") is None  # the new leader goes on with the job
    assert bed.ha.job_graph_store().job_ids() == ["j1"]
    with pytest.raises(NotLeaderRpcError):
        bed.call("get_job", JobID("j1"))
    with pytest.raises(UnavailableError):
        bed.call("submit_job", bed.graph("j2"))


def test_calls_with_a_deposed_leaders_token_are_refused(bed: Bed) -> None:
    with pytest.raises(FencingTokenError, match="Dispatcher: submit_job with a stale fencing token"):
        bed.call("submit_job", bed.graph("j1"), token="leader-0")
    assert bed.masters == {}
    info = bed.call("cluster_info", token=None)  # not fenced: how a client learns the token
    assert info.leader_session_id == TOKEN and (info.registered_taskexecutors, info.total_slots, info.free_slots) == (1, 4, 2)


def test_shutdown_stops_accepting_jobs(bed: Bed) -> None:
    bed.call("shutdown_cluster")
    assert bed.shutdowns.wait(5)
    with pytest.raises(UnavailableError, match="shutting down"):
        bed.call("submit_job", bed.graph("j1"))


def client_waiting_for_result(bed: Bed, job_id: str) -> tuple[threading.Thread, list[Any]]:
    """A client waiting (a minute at most) for the job's result, once the Dispatcher knows it waits."""
    waiting, got = on_thread(lambda: bed.call("request_job_result", JobID(job_id), 60_000))
    wait_until(lambda: bed.d._result_waiters.get(JobID(job_id)), 5, "the client never waited")  # noqa: SLF001
    return waiting, got


def test_every_call_runs_on_the_dispatchers_main_thread(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    from yarnflow.am.dispatcher import dispatcher

    seen: list[str] = []
    real_check = dispatcher.check_savepoint

    def spy(config: Any, job_graph: JobGraph) -> None:
        seen.append(threading.current_thread().name)
        assert bed.d.main_thread is not None and bed.d.main_thread.in_main_thread()
        real_check(config, job_graph)

    monkeypatch.setattr(dispatcher, "check_savepoint", spy)
    bed.call("submit_job", bed.graph("j1"))
    assert bed.d.ask(bed.d.get_job, JobID("j1")).status == JobStatus.RUNNING  # the AppMaster's own parts: ask
    assert len(seen) == 1


def test_a_client_waiting_for_a_result_holds_no_thread_of_the_dispatcher(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    waiting, got = on_thread(lambda: bed.call("request_job_result", JobID("j1"), 60_000))
    for _ in range(100):  # while it waits, every other call is answered at once
        assert bed.call("get_job", JobID("j1")).status == JobStatus.RUNNING
    timed_out, expired = on_thread(lambda: bed.call("request_job_result", JobID("j1"), 50))
    timed_out.join(5)
    assert len(expired) == 1 and isinstance(expired[0], UnavailableError)  # its own wait ended, not the other
    assert waiting.is_alive() and got == []
    bed.masters["j1"].end(JobStatus.FINISHED)  # on the test's thread, as a JobMaster's own thread would
    waiting.join(5)
    assert [r.status for r in got] == [JobStatus.FINISHED]
    assert bed.d.wait_result_fetched(JobID("j1"), 5)


def test_a_savepoint_in_progress_holds_no_thread_of_the_dispatcher(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    pending: Future[str] = Future()
    bed.masters["j1"].savepoint_answer = pending
    taking, got = on_thread(lambda: bed.call("trigger_savepoint", JobID("j1"), "file:///sp"))
    wait_until(lambda: bed.masters["j1"].savepoints, 5, "the savepoint never reached the JobMaster")
    assert [j.job_id for j in bed.call("list_jobs")] == ["j1"]  # answered meanwhile
    bed.call("cancel_job", JobID("j1"))
    pending.set_result("file:///sp/savepoint-7")
    taking.join(5)
    assert got == ["file:///sp/savepoint-7"]


def test_the_appmasters_own_wait_for_a_result_is_not_a_clients_fetch(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    assert bed.d.job_result(JobID("j1"), 0.05) is None  # still running
    assert bed.d.job_result(JobID("nope"), 0.05) is None
    bed.masters["j1"].end(JobStatus.FAILED)
    result = bed.d.job_result(JobID("j1"), 5)
    assert result is not None and result.status == JobStatus.FAILED
    assert not bed.d.wait_result_fetched(JobID("j1"), 0.05)
    assert bed.ha.job_result_store().get("j1") is not None  # kept for a client
    fetched, _ = on_thread(lambda: bed.d.wait_result_fetched(JobID("j1"), 5))
    assert bed.call("request_job_result", JobID("j1"), 10).status == JobStatus.FAILED
    fetched.join(5)
    assert bed.ha.job_result_store().get("j1") is None


def test_stopping_answers_waiting_clients_and_stops_the_job_masters_left(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    waiting, got = client_waiting_for_result(bed, "j1")
    bed.d.stop(grace_s=0.05)
    waiting.join(5)
    assert len(got) == 1 and isinstance(got[0], UnavailableError) and "shutting down" in str(got[0])
    assert bed.masters["j1"].stopped
    with pytest.raises(UnavailableError):
        bed.call("list_jobs")


def test_a_deposed_dispatcher_ends_its_main_thread_once_its_jobs_ended_and_answers_not_leader(bed: Bed) -> None:
    bed.call("submit_job", bed.graph("j1"))
    waiting, got = client_waiting_for_result(bed, "j1")
    bed.d.suspend_all("lost the leadership")
    waiting.join(5)
    assert len(got) == 1 and isinstance(got[0], NotLeaderRpcError)  # ask the new leader
    assert bed.d.main_thread is not None and bed.d.main_thread.stopped
    for method, args in (("list_jobs", ()), ("get_job", (JobID("j1"),)), ("submit_job", (bed.graph("j2"),))):
        with pytest.raises(NotLeaderRpcError):
            bed.call(method, *args)


def _streaming(bed: Bed, job_id: str, parallelism: int = 2) -> JobGraph:
    graph = bed.graph(job_id)
    return dataclasses.replace(graph, vertices=[dataclasses.replace(graph.vertices[0], parallelism=parallelism),
                                                JobVertex(JobVertexID("one"), "one", 1, 1, ["one"])],
                               config={"execution.checkpointing.interval": "1 s"})


def test_a_rescale_takes_a_checkpoint_and_runs_the_job_on_rescaled_under_its_id_from_it(
        bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rescale_job``: a checkpoint is taken at once; once it completed the job is cancelled and
    a new JobMaster runs the same job id at the new parallelism from its latest checkpoint (made
    restorable at that parallelism beside it; vertices at the job's parallelism change, the
    others keep theirs), stored for a next leader; no result is recorded and a waiting client
    keeps waiting."""
    from yarnflow.am.dispatcher import rescaling

    monkeypatch.setattr(rescaling, "check_savepoint", lambda config, graph: None)
    monkeypatch.setattr(rescaling, "savepoint_of_checkpoint", lambda url: f"{url.rsplit('/', 1)[0]}/savepoint")
    bed.call("submit_job", _streaming(bed, "j1"))
    old = bed.masters["j1"]
    waiting, got = client_waiting_for_result(bed, "j1")
    pending: Future[str] = Future()
    old.checkpoint_answer = pending
    rescaling_, answer = on_thread(lambda: bed.call("rescale_job", JobID("j1"), 3))
    wait_until(lambda: old.checkpoints_asked, 5, "no checkpoint asked for")
    assert old.status == JobStatus.RUNNING and not old.savepoints  # no savepoint, no stop
    bed.ha.checkpoint_store(JobID("j1")).add(9, "memory://checkpoints/j1/chk-9/_metadata")
    pending.set_result("memory://checkpoints/j1/chk-9/_metadata")
    rescaling_.join(5)
    assert answer == [3] and old.status == JobStatus.CANCELED
    new = bed.masters["j1"]
    assert new is not old and new.started and not new.recover
    assert [v.parallelism for v in new.job_graph.vertices] == [3, 1]
    assert new.job_graph.config["execution.savepoint.path"] == "memory://checkpoints/j1/chk-9/savepoint"
    assert [v.parallelism for v in bed.ha.job_graph_store().get("j1").vertices] == [3, 1]
    assert bed.ha.job_result_store().get("j1") is None and not got
    new.end(JobStatus.FINISHED)  # the rescaled job's own end is the job's
    waiting.join(5)
    assert got and got[0].status == JobStatus.FINISHED


def test_a_job_graph_too_large_for_the_cluster_is_refused_before_it_is_read(bed: Bed) -> None:
    graph = bed.graph("huge")
    huge = dataclasses.replace(graph, vertices=[dataclasses.replace(graph.vertices[0], parallelism=100_001,
                                                                    max_parallelism=200_000)])
    with pytest.raises(InvalidRequestError, match="too large: 1 vertices, 0 edges, 100001 subtasks .*max-subtasks"):
        bed.call("submit_job", huge)
    assert "huge" not in bed.masters


def test_rescales_that_cannot_be_are_refused_and_the_job_runs_on(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before anything stops: no checkpoints, above the max parallelism, one already in
    progress. A checkpoint that fails leaves the job running; state that cannot go to the new
    parallelism starts the job again at its own; a job that ends meanwhile ends as it did."""
    from yarnflow.am.dispatcher import rescaling
    from yarnflow.common.errors import InvalidRequestError, RefusedError

    bed.call("submit_job", bed.graph("plain"))
    with pytest.raises(RefusedError, match="takes checkpoints"):
        bed.call("rescale_job", JobID("plain"), 2)
    bed.call("submit_job", _streaming(bed, "j1"))
    with pytest.raises(InvalidRequestError, match="max parallelism 128"):
        bed.call("rescale_job", JobID("j1"), 129)
    assert bed.call("rescale_job", JobID("j1"), 2) == 2 and not bed.masters["j1"].checkpoints_asked  # already there
    jm = bed.masters["j1"]
    jm.checkpoint_answer = Future()
    first, answer = on_thread(lambda: bed.call("rescale_job", JobID("j1"), 3))
    wait_until(lambda: jm.checkpoints_asked, 5, "no checkpoint asked for")
    with pytest.raises(RefusedError, match="being rescaled already"):
        bed.call("rescale_job", JobID("j1"), 4)
    jm.checkpoint_answer.set_exception(RefusedError("a task declined the checkpoint"))
    first.join(5)
    assert isinstance(answer[0], RefusedError) and "runs on at its parallelism" in str(answer[0])
    assert bed.masters["j1"] is jm and jm.status == JobStatus.RUNNING

    monkeypatch.setattr(rescaling, "check_savepoint", lambda config, graph: (_ for _ in ()).throw(
        InvalidRequestError("operator 'numbers' cannot be rescaled")))
    monkeypatch.setattr(rescaling, "savepoint_of_checkpoint", lambda url: "memory://checkpoints/j1/chk-4/savepoint")
    bed.ha.checkpoint_store(JobID("j1")).add(4, "memory://checkpoints/j1/chk-4/_metadata")
    jm.checkpoint_answer = None
    second, answer = on_thread(lambda: bed.call("rescale_job", JobID("j1"), 3))
    second.join(5)
    assert isinstance(answer[0], RefusedError) and "operator 'numbers'" in str(answer[0])
    again = bed.masters["j1"]
    assert again is not jm and [v.parallelism for v in again.job_graph.vertices] == [2, 1]
    assert again.job_graph.config["execution.savepoint.path"] == "memory://checkpoints/j1/chk-4/savepoint"

    again.checkpoint_answer = Future()
    third, answer = on_thread(lambda: bed.call("rescale_job", JobID("j1"), 3))
    wait_until(lambda: again.checkpoints_asked, 5, "no third checkpoint asked for")
    again.end(JobStatus.FINISHED)  # it ended before its checkpoint completed
    third.join(5)
    assert isinstance(answer[0], RefusedError) and "ended FINISHED" in str(answer[0])
    assert bed.ha.job_result_store().get("j1") is not None


@pytest.mark.parametrize("retention, kept", [("", False), ("RETAIN_ON_CANCELLATION", True)],
                         ids=["default", "retained"])
def test_a_new_leader_deletes_the_checkpoints_an_ended_jobs_retention_does_not_keep(
        tmp_path: Path, retention: str, kept: bool) -> None:
    """The old leader recorded the job's end (CANCELED) and died before cleaning up: the new one
    deletes the job's checkpoints unless its retention keeps them."""
    ha = EmbeddedHaServices()
    first = Bed(tmp_path, ha)
    graph = first.graph("ended")
    if retention:
        graph = dataclasses.replace(graph, config={"execution.checkpointing.externalized-checkpoint-retention":
                                                   retention})
    ha.job_graph_store().put(graph)
    ha.job_result_store().put(JobResultEntry(JobResult(JobID("ended"), JobStatus.CANCELED, 1, 2), 5))
    chk = tmp_path / "storage" / "checkpoints" / "ended" / "chk-3"
    chk.mkdir(parents=True)
    (chk / "_metadata").write_text("{}")
    bed = Bed(tmp_path, ha)
    assert bed.d.recover_jobs() == []
    if kept:
        time.sleep(0.3)
        assert chk.exists()
    else:
        wait_until(lambda: not chk.parent.exists(), 5, "the ended job's checkpoints stayed")
    bed.d.stop(grace_s=0)
    first.d.stop(grace_s=0)
