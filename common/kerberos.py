"""Kerberos for YARN applications (``security.kerberos.*``, Flink's keys; docs/security.md).

The client's skein driver logs in with the keytab and principal (``skein.Client(principal,
keytab)``), the application gets HDFS delegation tokens for the file systems it uses (skein's
``ApplicationSpec.file_systems``: YARN hands them to every container, where libhdfs, and so
fsspec's HDFS, finds them through ``HADOOP_TOKEN_FILE_LOCATION``), and the keytab travels to the
containers as a private application file, where ``TicketRenewal`` runs ``kinit`` with it every
``security.kerberos.relogin.period``, so a job that outlives its tickets keeps its access.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from urllib.parse import urlparse

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError

log = logging.getLogger(__name__)

#: the keytab's name in every container's directory
KEYTAB_FILE = "krb5.keytab"


def login(config: Configuration) -> tuple[str, str] | None:
    """``(principal, keytab path)`` when Kerberos keys are set (both, the keytab readable); None
    when neither is. Raises ConfigurationError for one without the other or a keytab that
    cannot be read."""
    keytab, principal = config[Options.KRB_KEYTAB], config[Options.KRB_PRINCIPAL]
    if not keytab and not principal:
        return None
    if not keytab or not principal:
        raise ConfigurationError(f"Kerberos needs both {Options.KRB_KEYTAB.key} and {Options.KRB_PRINCIPAL.key}")
    path = os.path.abspath(os.path.expanduser(keytab))
    if not os.access(path, os.R_OK):
        raise ConfigurationError(f"{Options.KRB_KEYTAB.key}: cannot read the keytab {path}")
    return principal, path


def delegation_file_systems(config: Configuration) -> list[str]:
    """The Hadoop file systems the application needs delegation tokens for: the configured ones
    and those of its storage, checkpoint, savepoint and staging directories (hdfs/viewfs)."""
    wanted = [u.strip() for u in config[Options.KRB_FILE_SYSTEMS].split(",") if u.strip()]
    for option in (Options.HA_STORAGE_DIR, Options.CHECKPOINT_DIR, Options.SAVEPOINTS_DIR, Options.YARN_STAGING_DIR):
        url = urlparse(str(config[option] or ""))
        if url.scheme in ("hdfs", "viewfs") and url.netloc:
            wanted.append(f"{url.scheme}://{url.netloc}")
    return sorted(set(wanted))


class TicketRenewal:
    """In a YARN container whose application shipped a keytab: ``kinit`` with it now and every
    ``period_s`` on a daemon thread (stop: ``stop()``). Without ``kinit`` it says so once and
    stops: the delegation tokens carry the container until they expire."""

    def __init__(self, principal: str, keytab: str, period_s: float, kinit: str = "kinit") -> None:
        self.principal, self.keytab, self.period_s, self.kinit = principal, keytab, period_s, kinit
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kerberos-renewal", daemon=True)

    @classmethod
    def in_container(cls, config: Configuration) -> TicketRenewal | None:
        principal = config[Options.KRB_PRINCIPAL]
        keytab = os.path.join(os.environ.get("PWD") or os.getcwd(), KEYTAB_FILE)
        if not principal or not os.environ.get("SKEIN_APPLICATION_ID") or not os.path.exists(keytab):
            return None
        return cls(principal, keytab, config[Options.KRB_RELOGIN] / 1000.0).start()

    def start(self) -> TicketRenewal:
        self._thread.start()
        return self

    def renew(self) -> bool:
        """One ``kinit``; False (logged) when it failed or there is no kinit."""
        if shutil.which(self.kinit) is None:
            log.warning("no %s in this container: its Kerberos ticket is not renewed from the keytab (the "
                        "application's delegation tokens are used until they expire)", self.kinit)
            self._stop.set()
            return False
        done = subprocess.run([self.kinit, "-kt", self.keytab, self.principal], capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            log.warning("renewing the Kerberos ticket of %s failed: %s", self.principal,
                        (done.stderr or done.stdout).strip()[-500:])
            return False
        self.renewals += 1
        log.info("renewed the Kerberos ticket of %s from the keytab", self.principal)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.renew()
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("renewing the Kerberos ticket of %s failed: %s", self.principal, exc)
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
