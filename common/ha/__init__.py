"""High availability (``high-availability.type``): leader election of the AppMaster, leader
retrieval for everyone who follows it, and the stores from which a new leader recovers every
job (contracts in ``api.py``; ``embedded.py`` for ``none``, ``zookeeper/`` for ``zookeeper``).

``create_ha_services(config)`` gives a process its services; close them when the process ends
(with ZooKeeper that ends the session, and with it any leadership held)."""

from __future__ import annotations

from yarnflow.common.config import Configuration, Options
from yarnflow.common.ha.api import (
    CheckpointIDCounter,
    CompletedCheckpointStore,
    HighAvailabilityServices,
    JobGraphStore,
    JobResultEntry,
    JobResultStore,
    LeaderContender,
    LeaderElection,
    LeaderInformation,
    LeaderRetrieval,
)
from yarnflow.common.ha.embedded import EmbeddedHaServices

__all__ = [
    "CheckpointIDCounter",
    "CompletedCheckpointStore",
    "EmbeddedHaServices",
    "HighAvailabilityServices",
    "JobGraphStore",
    "JobResultEntry",
    "JobResultStore",
    "LeaderContender",
    "LeaderElection",
    "LeaderInformation",
    "LeaderRetrieval",
    "create_ha_services",
    "ha_enabled",
]


def ha_enabled(config: Configuration) -> bool:
    return bool(config[Options.HA_TYPE] == "zookeeper")


def create_ha_services(config: Configuration, leader_address: str = "") -> HighAvailabilityServices:
    """The services ``config`` asks for. ``leader_address``: with HA off, the leader to report
    to retrieval (it cannot be looked up).

    Raises ConfigurationError for incomplete ZooKeeper settings and
    CoordinationUnavailableError when ZooKeeper cannot be reached within the connection timeout."""
    if ha_enabled(config):
        from yarnflow.common.ha.zookeeper import ZooKeeperHaServices

        return ZooKeeperHaServices(config)
    return EmbeddedHaServices(leader_address)
