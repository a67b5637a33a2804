"""AppMaster: puts the Dispatcher, the ResourceManager and the JobMasters behind one Thrift
port, owns the working and storage directories, and contends for the cluster's leadership.

Leadership (``common/ha``): with ``high-availability.type: none`` the AppMaster leads as soon as
it starts. With ``zookeeper`` several AppMasters may run; the one elected leads and the others
stand by, serving their port but refusing every call with NotLeaderRpcError (naming the leader
when known). On a grant the AppMaster starts a ResourceManager and a Dispatcher whose fencing
token is the leader session id, recovers every stored job without a result, and then publishes
its address (TaskExecutors and clients find it in ZooKeeper). On a revoke it suspends every
JobMaster and the ResourceManager at once and stands by again. A standby exits when the cluster
is shut down (a client's ``session stop``), rather than taking over."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any, cast

import fsspec

from yarnflow.am.dispatcher.dispatcher import Dispatcher
from yarnflow.am.metrics import appmaster_families
from yarnflow.am.rest.server import RestServer
from yarnflow.am.resourcemanager.drivers.base import ResourceDriver
from yarnflow.am.resourcemanager.drivers.local import LocalProcessDriver
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.common.addresses import check_bind_address, rest_bind_address
from yarnflow.common.config import Configuration, Options
from yarnflow.common.security import internal_credentials, rest_auth_token
from yarnflow.common.errors import ConfigurationError, NotLeaderRpcError, UnavailableError
from yarnflow.common.ha import HighAvailabilityServices, LeaderInformation, create_ha_services
from yarnflow.common.metrics import PrometheusEndpoint, start_prometheus
from yarnflow.common.errors import NotFoundError
from yarnflow.common.rpc.gateways import (
    DISPATCHER,
    JOB_MASTER,
    RESOURCE_MANAGER,
    DispatcherServiceHandler,
    JobMasterServiceHandler,
    ResourceManagerServiceHandler,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor
from yarnflow.common.rpc.limits import RpcLimits
from yarnflow.common.rpc.server import RpcServer

log = logging.getLogger(__name__)


def default_work_dir(config: Configuration, cluster_id: str) -> str:
    dirs = [d.strip() for d in config[Options.TMP_DIRS].split(",") if d.strip()]
    return os.path.join(dirs[0] if dirs else tempfile.gettempdir(), f"yarnflow-{cluster_id}")


class _LeaderComponent:
    """The current leader term's component ``name`` ("rm" or "dispatcher"), for the RPC
    handlers and JobMasters: every attribute is looked up at the moment of use. While this
    AppMaster stands by, using it raises NotLeaderRpcError."""

    def __init__(self, appmaster: AppMaster, name: str) -> None:
        self._am = appmaster
        self._name = name

    def __getattr__(self, attr: str) -> object:
        component = getattr(self._am, self._name)
        if component is None:
            raise NotLeaderRpcError(self._am.standby_message())
        return getattr(component, attr)


class _NoJobMaster:
    """Answers a call to the JobMaster of a job that does not run here (any more): NOT_FOUND
    from the leader (the TaskExecutor frees the job's slots), NOT_LEADER from a standby."""

    def __init__(self, appmaster: AppMaster) -> None:
        self._am = appmaster

    def rpc_invoke(self, method: str, token: str | None, args: tuple[Any, ...]) -> Any:
        if not self._am.is_leader:
            raise NotLeaderRpcError(self._am.standby_message())
        raise NotFoundError(f"no running job here for {method}")


class AppMaster:
    def __init__(self, config: Configuration, cluster_id: str, target: str = "local",
                 driver: ResourceDriver | None = None, work_dir: str | None = None,
                 ha: HighAvailabilityServices | None = None) -> None:
        check_bind_address(config[Options.RPC_ADDRESS], Options.RPC_ADDRESS.key)
        if config[Options.REST_ENABLED]:
            check_bind_address(rest_bind_address(config), Options.REST_BIND_ADDRESS.key
                               if config[Options.REST_BIND_ADDRESS] else Options.REST_ADDRESS.key)
        self.config = config
        self.cluster_id = cluster_id
        self.target = target
        self.work_dir = work_dir or default_work_dir(config, cluster_id)
        os.makedirs(self.work_dir, exist_ok=True)
        self.ha = ha or create_ha_services(config)
        storage = config[Options.HA_STORAGE_DIR]
        if not storage:
            if self.ha.kind != "none":
                raise ConfigurationError("high-availability.storageDir must be set with high-availability.type "
                                         "zookeeper: every AppMaster reads the jobs' data from it")
            storage = "file://" + os.path.join(self.work_dir, "storage")
        self.storage_dir = storage.rstrip("/")
        fs, path = fsspec.core.url_to_fs(self.storage_dir)
        fs.makedirs(path, exist_ok=True)
        self.driver = driver or LocalProcessDriver(config, self.work_dir)
        # bounded as a TaskExecutor's (blob.*): a long-lived session sees many jobs' artifacts
        self._artifacts = ArtifactCache.bounded(config, self.work_dir, self._artifacts_in_use)
        # the current leader term's components; None while standing by
        self.rm: ResourceManager | None = None
        self.dispatcher: Dispatcher | None = None
        self.session_id = ""
        self.leader: LeaderInformation | None = None  # who leads, as far as this AppMaster knows
        self._followed_another = False
        #: runs the leadership terms' changes and the start of the shutdown, one at a time (the
        #: election's callbacks and a shutdown come on threads of their own)
        self._main = MainThreadExecutor("appmaster").start()
        self._stopped = threading.Event()
        self._finished = threading.Event()  # shutdown() is over: threads joined, TaskExecutors stopped
        self._shutting_down = False
        # typed as what they forward to
        self.rm_proxy = cast(ResourceManager, _LeaderComponent(self, "rm"))
        self.dispatcher_proxy = cast(Dispatcher, _LeaderComponent(self, "dispatcher"))
        #: the cluster's credentials (security.ssl.internal.*): mutual TLS on its RPC server
        self.tls = internal_credentials(config)
        self.server = RpcServer(config[Options.RPC_ADDRESS], config[Options.RPC_PORT], {
            DISPATCHER: DispatcherServiceHandler(self.dispatcher_proxy).processor(),
            RESOURCE_MANAGER: ResourceManagerServiceHandler(self.rm_proxy).processor(),
        }, name="appmaster", tls=self.tls, limits=RpcLimits.from_config(config))
        # each running job's JobMaster is served as jobmaster/<job id> (by the Dispatcher)
        self.server.fallback(JOB_MASTER, JobMasterServiceHandler(_NoJobMaster(self)).processor())
        self._election = self.ha.leader_election()
        self._retrieval = self.ha.leader_retrieval()
        #: called (on the election's thread) with the new Dispatcher and leader session id each
        #: time this AppMaster is granted the leadership, after it recovered the cluster's jobs and
        #: before it confirms (publishes) the leadership: what must be in place before any client
        #: reaches it (a per-job cluster's job)
        self.on_granted: list[Callable[[Dispatcher, str], None]] = []
        #: called (on the election's thread) each time this AppMaster starts to lead
        self.on_leadership: list[Callable[[], None]] = []
        #: called once when this AppMaster stops: (the cluster ends with it, why)
        self.on_shutdown: list[Callable[[bool, str], None]] = []
        self.shutdown_reason = ""
        self.rest: RestServer | None = RestServer(self) if config[Options.REST_ENABLED] else None
        self.metrics: PrometheusEndpoint | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def is_leader(self) -> bool:
        return self.dispatcher is not None

    def standby_message(self) -> str:
        leader = self.leader
        where = f"; the leader is at {leader.address}" if leader is not None and leader.address != self.address else ""
        return f"AppMaster {self.address} of cluster {self.cluster_id} is not the leader{where}"

    @property
    def web_url(self) -> str:
        return self.rest.url if self.rest is not None else ""

    def _artifacts_in_use(self) -> set[str]:
        """(any thread) The artifacts of the jobs running here."""
        dispatcher = self.dispatcher
        return set() if dispatcher is None else dispatcher.running_artifacts()

    def start(self) -> AppMaster:
        self.server.start()
        if self.rest is not None:
            self.rest.start()
        self.metrics = start_prometheus(self.config, lambda: appmaster_families(self), f"AppMaster {self.address}",
                                        rest_auth_token(self.config, self.tls))
        log.info("AppMaster of cluster %s serving at %s (work dir %s, storage %s, high availability %s)",
                 self.cluster_id, self.address, self.work_dir, self.storage_dir, self.ha.kind)
        self._retrieval.start(self._on_leader)
        self.ha.on_cluster_shutdown(self._cluster_shut_down)
        self._election.start(self)
        return self

    def _on_leader(self, leader: LeaderInformation | None) -> None:
        self.leader = leader
        if leader is not None and leader.address != self.address:
            self._followed_another = True  # its TaskExecutors come to this one if it leads next

    def _cluster_shut_down(self) -> None:
        if not self.is_leader and not self._stopped.is_set():
            log.info("the cluster was shut down: this standby AppMaster exits")
            threading.Thread(target=self.shutdown, name="shutdown", daemon=True).start()

    # -- leadership (called by the election; run one at a time on the AppMaster's main thread) ----
    def grant_leadership(self, session_id: str) -> None:
        self._on_main(self._grant_leadership, session_id)

    def revoke_leadership(self) -> None:
        self._on_main(self._revoke_leadership)

    def _on_main(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._main.call(fn, *args, timeout=None)
        except UnavailableError:
            log.info("AppMaster stopped: %s ignored", fn.__name__.lstrip("_"))

    def _grant_leadership(self, session_id: str) -> None:
        if self._stopped.is_set():
            return
        log.info("AppMaster %s leads cluster %s (leader session %s)", self.address, self.cluster_id, session_id)
        # another AppMaster led before: its TaskExecutors will register here
        failover = self._followed_another and getattr(self.driver, "workers_outlive_leader", True)
        rm = ResourceManager(self.config, self.driver, fencing_token=session_id)
        dispatcher = Dispatcher(self.config, self.rm_proxy, self.cluster_id, self.storage_dir, self.target,
                                self.shutdown, self._artifacts, ha=self.ha, fencing_token=session_id,
                                is_leader=lambda: self._election.has_leadership(session_id),
                                rpc_server=self.server)
        dispatcher.address = self.address
        dispatcher.web_url = self.web_url
        self.session_id = session_id
        self.rm, self.dispatcher = rm, dispatcher
        rm.start(self.address, recover_previous_workers=failover)
        recovered = dispatcher.recover_jobs()
        if recovered:
            log.info("recovered %d jobs: %s", len(recovered), ", ".join(recovered))
        for hook in self.on_granted:
            hook(dispatcher, session_id)
        self._election.confirm_leadership(session_id, self.address)
        for listener in self.on_leadership:
            listener()

    def _revoke_leadership(self) -> None:
        dispatcher, rm = self.dispatcher, self.rm
        if dispatcher is None:
            return
        log.warning("AppMaster %s lost the leadership of cluster %s (session %s): suspending its jobs",
                    self.address, self.cluster_id, self.session_id)
        self.dispatcher = self.rm = None
        self.session_id = ""
        if rm is not None:  # first: it starts no worker more, whatever keeps the Dispatcher busy
            rm.suspend()
        dispatcher.suspend_all("this AppMaster lost the leadership")  # its main thread ends after them

    # -- for tests ---------------------------------------------------------------------------------
    def replace_resource_manager(self) -> ResourceManager:
        """A new ResourceManager leader takes over (as after a leadership change): the old one
        is suspended, TaskExecutors re-register with the new one (their heartbeats are refused
        for the stale fencing token), and JobMasters reconnect and ask again for the slots they
        still wait for."""
        old = self.rm
        assert old is not None, "not the leader"
        old.suspend()
        self.rm = ResourceManager(self.config, self.driver)
        self.rm.start(self.server.address)
        log.info("ResourceManager %s replaced %s", self.rm.fencing_token, old.fencing_token)
        return self.rm

    # -- lifecycle ---------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """True once this AppMaster is shutting down (or stopped), False after ``timeout``."""
        return self._stopped.wait(timeout)

    def wait_finished(self, timeout: float | None = None) -> bool:
        """True once its shutdown is over: servers stopped, TaskExecutors stopped or kept."""
        return self._finished.wait(timeout)

    def end_cluster(self) -> None:
        """Stop this AppMaster and end its cluster with it (a per-job application whose job
        ended): with high availability the cluster is first marked shut down, so no standby or
        later application attempt takes over."""
        if self.ha.kind != "none":
            try:
                self.ha.request_cluster_shutdown()
            except Exception as exc:  # noqa: BLE001 - no longer leading: the leader decides
                log.warning("could not mark cluster %s shut down: %s", self.cluster_id, exc)
        self.shutdown()

    def fail(self, reason: str) -> None:
        """The cluster cannot go on (e.g. too many failed containers): end it, saying why."""
        log.error("AppMaster failing: %s", reason)
        self.shutdown_reason = reason
        threading.Thread(target=self.shutdown, name="shutdown", daemon=True).start()

    def shutdown(self) -> None:
        """Stop this AppMaster. When the cluster ends with it (high availability off, or a
        client shut the cluster down) its jobs are cancelled and its TaskExecutors stopped. With
        high availability otherwise (a signal, the container going away) the jobs are only
        suspended and the TaskExecutors kept: the next leader goes on with both."""
        try:
            if not self._main.call(self._begin_shutdown, timeout=None):
                return
        except UnavailableError:
            return
        try:
            cluster_ends = self.ha.kind == "none" or self.ha.cluster_shut_down() or bool(self.shutdown_reason)
            log.info("AppMaster shutting down (%s)", "the cluster ends" if cluster_ends
                     else "high availability: its jobs go on under the next leader")
            dispatcher = self._main.call(self._end_term, cluster_ends, timeout=None)
            self._main.stop()
            self._quietly(self._election.stop)
            self._quietly(self._retrieval.stop)
            self._quietly(self.ha.close)
            for listener in self.on_shutdown:
                self._quietly(lambda listener=listener: listener(cluster_ends, self.shutdown_reason))
            self.server.stop()
            if dispatcher is not None:
                self._quietly(dispatcher.stop)
            for endpoint in (self.rest, self.metrics):
                if endpoint is not None:
                    self._quietly(endpoint.stop)
            log.info("AppMaster stopped")
        finally:
            self._stopped.set()
            self._main.stop()
            self._finished.set()

    def _begin_shutdown(self) -> bool:
        """Whether this call is the first to shut the AppMaster down."""
        first, self._shutting_down = not self._shutting_down, True
        return first

    def _end_term(self, cluster_ends: bool) -> Dispatcher | None:
        """End the leader term, if one runs: its jobs cancelled when the cluster ends with this
        AppMaster, suspended otherwise. Returns its Dispatcher, to stop once the server stopped."""
        dispatcher, rm = self.dispatcher, self.rm
        if dispatcher is not None:
            dispatcher.stop_accepting()
            if cluster_ends:
                dispatcher.cancel_all(timeout_s=10)
            else:
                dispatcher.suspend_all("its AppMaster is shutting down")
            if self.rest is not None:  # ended jobs' archives are written while their answers are still here
                self.rest.flush_archives(10.0)
        if rm is not None:
            if cluster_ends:
                rm.stop()
            else:
                rm.suspend()
        self.dispatcher = self.rm = None
        self._stopped.set()
        return dispatcher

    @staticmethod
    def _quietly(fn: Any) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - shutting down: nothing more to do about it
            log.debug("during shutdown", exc_info=True)
