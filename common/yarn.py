"""What the AppMaster and the client share about a YARN application: where the leading
AppMaster publishes its address (the application's skein key-value store), how an application
id shapes the cluster's configuration, and the attempt number in a YARN container id."""

from __future__ import annotations

import re

from yarnflow.common.config import Configuration, Options

__all__ = ["ADDRESS_KEY", "application_config", "container_attempt"]

#: key of the application's skein key-value store under which the leading AppMaster publishes
#: its RPC address (HOST:PORT)
ADDRESS_KEY = "yarnflow.address"
#: application mode: the files (in the AppMaster container's log folder, so YARN aggregates them)
#: that main()'s standard and error output go to; the client prints them once the application ended
MAIN_OUT, MAIN_ERR = "main.out", "main.err"
#: "mutual" when the application's RPC is mutual TLS with its skein credentials
TLS_KEY = "yarnflow.tls"
_DEFAULT_CLUSTER_ID = "default"
#: set by an application-mode AppMaster for its main(): the seed of the jobs' fixed ids
FIXED_JOB_IDS_VAR = "YARNFLOW_FIXED_JOB_IDS"
#: set by an application-mode AppMaster that runs main() again without high availability: each
#: job starts from its latest retained checkpoint, if it has one
RESUME_VAR = "YARNFLOW_RESUME_FROM_CHECKPOINTS"


def application_config(config: Configuration, app_id: str) -> Configuration:
    """The configuration of the cluster that YARN application ``app_id`` runs: its high
    availability cluster id is the application id (unless one was configured), and without a
    ``high-availability.storageDir`` the job data goes to ``<yarn.staging-directory>/<app id>``
    (when a staging directory is configured)."""
    overrides: dict[str, str] = {}
    if config[Options.HA_CLUSTER_ID] in ("", _DEFAULT_CLUSTER_ID):
        overrides[Options.HA_CLUSTER_ID.key] = app_id
    staging = config[Options.YARN_STAGING_DIR]
    if not config[Options.HA_STORAGE_DIR] and staging:
        overrides[Options.HA_STORAGE_DIR.key] = f"{staging.rstrip('/')}/{app_id}"
    return config.with_overrides(overrides, source="YARN application") if overrides else config


def container_attempt(container_id: str) -> int:
    """The application attempt of a YARN container id (``container_<ts>_<app>_<attempt>_<n>``,
    or ``container_e<epoch>_<ts>_<app>_<attempt>_<n>``); 1 when it cannot be read."""
    m = re.fullmatch(r"container_(?:e\d+_)?\d+_\d+_(\d+)_\d+", container_id or "")
    return int(m.group(1)) if m else 1
