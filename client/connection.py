"""How the client reaches a cluster's Dispatcher: at a fixed address (``--address``); with
ZooKeeper high availability (``-D high-availability.type=zookeeper`` and its keys, or a
configuration file with them), at whichever AppMaster leads the cluster now; or, for a YARN
application (``-D yarn.application.id=ID``), at the address its AppMaster published in the
application's skein key-value store (with high availability on as well: the leader in
ZooKeeper, whose cluster id is then the application id unless one is configured).

With high availability a call that fails because the leader changed (the old one is gone,
answers that it no longer leads, or refuses the old fencing token) is made again at the new
leader once ZooKeeper names it, for up to ``client.timeout``. A job submitted just before the
change is not submitted twice: the new leader recovered it (``RefusedError`` "already
submitted" counts as success for ``submit_job``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import (
    ConfigurationError,
    YarnError,
    FencingTokenError,
    NotLeaderRpcError,
    RpcConnectionError,
    UnavailableError,
)
from yarnflow.common.ha import HighAvailabilityServices, LeaderInformation, create_ha_services, ha_enabled
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.security import RestAccess, client_credentials
from yarnflow.common.yarn import application_config

__all__ = ["ClusterConnection"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_LEADER_CHANGED = (RpcConnectionError, NotLeaderRpcError, FencingTokenError)


class ClusterConnection:
    """``address``: the Dispatcher's HOST:PORT; empty to find the leader in ZooKeeper (the
    configuration must then enable ZooKeeper high availability).

    Raises ConfigurationError with none of them, CoordinationUnavailableError when ZooKeeper
    cannot be reached within its connection timeout, and YarnError when the YARN application
    cannot be found or is not running."""

    def __init__(self, config: Configuration, address: str = "", call_timeout_ms: int = 15_000) -> None:
        self._wait_s = config[Options.CLIENT_TIMEOUT] / 1000.0
        self._yarn: Any = None
        app_id = config[Options.YARN_APPLICATION_ID]
        if not address and app_id:
            from yarnflow.yarn import ApplicationLocator

            config = application_config(config, app_id)
            self._yarn = ApplicationLocator(app_id)
            if not ha_enabled(config):
                address = self._yarn.address(self._wait_s)
            else:
                self._yarn.check_running()
        self._config = config
        self._call_timeout_ms = call_timeout_ms
        self._changed = threading.Condition()
        self._leader: LeaderInformation | None = LeaderInformation(address, "") if address else None
        self._ha: HighAvailabilityServices | None = None
        if not address:
            if not ha_enabled(config):
                raise ConfigurationError("no cluster to talk to: give --address HOST:PORT, -D yarn.application.id=ID "
                                         "for a YARN session, or the ZooKeeper high availability keys "
                                         "(-D high-availability.type=zookeeper, -D high-availability.zookeeper.quorum=..., "
                                         "-D high-availability.cluster-id=...)")
            self._ha = create_ha_services(config)
            self._retrieval = self._ha.leader_retrieval()
            self._retrieval.start(self._on_leader)
        self._gateway: RemoteDispatcherGateway | None = None
        self._gateway_of: LeaderInformation | None = None

    @property
    def follows_leader(self) -> bool:
        return self._ha is not None

    @property
    def address(self) -> str:
        leader = self._leader
        return leader.address if leader is not None else "(no leader yet)"

    def _on_leader(self, leader: LeaderInformation | None) -> None:
        with self._changed:
            self._leader = leader
            self._changed.notify_all()

    def _current(self, deadline: float) -> LeaderInformation:
        with self._changed:
            while self._leader is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    cluster = self._config[Options.HA_CLUSTER_ID]
                    raise UnavailableError(f"no AppMaster leads cluster {cluster!r} (nothing in ZooKeeper at "
                                           f"{self._config[Options.ZK_QUORUM]} for {self._wait_s:.0f} s)")
                self._changed.wait(min(left, 0.5))
            return self._leader

    def gateway(self, deadline: float | None = None) -> RemoteDispatcherGateway:
        """A gateway to the current leader (waiting for one, with high availability)."""
        leader = self._current(deadline if deadline is not None else time.monotonic() + self._wait_s)
        if self._gateway is None or leader != self._gateway_of:
            if self._gateway is not None:
                self._gateway.close()
            self._gateway = RemoteDispatcherGateway(leader.address, self._call_timeout_ms,
                                                    tls=self._credentials(leader.address))
            self._gateway_of = leader
        return self._gateway

    def call(self, fn: Callable[[RemoteDispatcherGateway], T], what: str = "call") -> T:
        """``fn(gateway)`` at the leader; with high availability made again at the next leader
        when the leader changed under it (for up to ``client.timeout``)."""
        deadline = time.monotonic() + self._wait_s
        while True:
            gw = self.gateway(deadline)
            try:
                return fn(gw)
            except _LEADER_CHANGED as exc:
                if self._yarn is not None and self._ha is None:
                    self._follow_application(exc, deadline)
                    continue
                if self._ha is None or time.monotonic() > deadline:
                    raise
                log.info("%s at %s failed (%s): looking for the leader again", what, gw.address, exc)
                if isinstance(exc, FencingTokenError):
                    try:  # the same AppMaster may lead again, in a new session
                        gw.refresh_fencing_token()
                    except (RpcConnectionError, UnavailableError):
                        pass
                time.sleep(0.2)

    def _credentials(self, address: str) -> Any:
        """The configured credentials, a YARN application's (its skein client's), or a local
        session's published for ``address``; None: plain."""
        if self._yarn is not None and not self._config.is_set(Options.SSL_INTERNAL_CERT):
            found = self._yarn.credentials()
            if found is not None:
                return found
        return client_credentials(self._config, address)

    def rest_access(self) -> RestAccess:
        """The token header (and HTTPS context) for the leader's REST API."""
        leader = self._leader
        return RestAccess.of(self._credentials(leader.address) if leader is not None else None)

    def _follow_application(self, exc: Exception, deadline: float) -> None:
        """The YARN application's AppMaster did not answer: say so when the application ended
        (its final status and diagnostics), else look its address up again (a new attempt)."""
        self._yarn.check_running()
        if time.monotonic() > deadline:
            raise exc
        time.sleep(0.2)
        try:
            address = self._yarn.address(max(0.0, deadline - time.monotonic()))
        except YarnError:
            self._yarn.check_running()
            raise exc from None
        with self._changed:
            self._leader = LeaderInformation(address, "")

    def drop_gateway(self) -> None:
        """Forget the current connection (the next call makes a new one): after a call was cut
        short (Ctrl-C), its answer must not be read as the next call's."""
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None
        if self._ha is not None:
            try:
                self._retrieval.stop()
            finally:
                self._ha.close()
            self._ha = None
