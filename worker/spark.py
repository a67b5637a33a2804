"""The TaskExecutor's SparkSession: created lazily by the first Spark stage that runs in this
process, shared by every slot, stopped when the TaskExecutor stops (``stop_session``).

Built from the ``spark.*`` keys of the job's configuration. ``spark.master`` defaults to
``local[N]`` with N the TaskExecutor's cores; on a Hadoop cluster set it to ``yarn`` and Spark
starts its own executors there. Arrow conversions are on and the UI off unless configured;
a local master binds to the loopback address."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)

_lock = threading.Lock()
_session: Any = None

#: what yarnflow sets unless the job's configuration says otherwise
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "512m",
}


def default_master(config: Mapping[str, str]) -> str:
    """``local[N]``, N = the TaskExecutor's cores (taskmanager.cpu.cores, else this machine's)."""
    try:
        cores = float(config.get("taskmanager.cpu.cores", "0") or 0)
    except ValueError:
        cores = 0.0
    n = math.ceil(cores) if cores > 0 else (os.cpu_count() or 1)
    return f"local[{max(1, n)}]"


class MasterProvider(Protocol):
    """Where a stage's Spark runs when its job names no ``spark.master``: the TaskExecutor asks
    the AppMaster (``TaskExecutor.spark_masters``). ``acquire`` returns the URL of the
    AppMaster's Spark master (kept from its idle timeout until ``release``), or ``"local"``
    for ``local[N]`` in this TaskExecutor."""

    def acquire(self, settings: dict[str, str]) -> str: ...

    def release(self) -> None: ...


def spark_settings(config: Mapping[str, str], master: str = "") -> dict[str, str]:
    """The Spark configuration of a job: its ``spark.*`` keys over yarnflow's defaults, with
    ``master`` (the AppMaster's answer) when the job names none."""
    settings = dict(DEFAULTS)
    settings.update({k: v for k, v in config.items() if k.startswith("spark.") and v != ""})
    if not settings.get("spark.master"):
        settings["spark.master"] = master if master and master != "local" else default_master(config)
    url = settings["spark.master"]
    # executors run Python functions (UDFs) with this TaskExecutor's Python unless told otherwise
    settings.setdefault("spark.pyspark.python", sys.executable)
    if url.startswith("local") or url.startswith(("spark://127.0.0.1:", "spark://localhost:")):
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    return settings


def resolve_master(config: Mapping[str, str], provider: MasterProvider | None) -> str:
    """Where a stage's Spark runs: the job's ``spark.master`` if it names one, else what the
    AppMaster answers (its standalone cluster, or ``"local"``; a cluster is then held until
    the stage calls ``provider.release()``)."""
    if config.get("spark.master") or provider is None:
        return ""
    asked = {k: v for k, v in config.items() if k.startswith(("spark.", "spark-stages."))}
    return provider.acquire(asked)


def stage_session(config: Mapping[str, str], master: str = "") -> Any:
    """A session of its own for one Spark stage (``newSession``: the TaskExecutor's SparkContext,
    but its own temporary views and SQL settings), with the job's ``spark.sql.*`` keys set:
    two stages running at once in one TaskExecutor cannot see each other's views or settings.
    ``master``: the AppMaster's answer (``resolve_master``) when the job names no master."""
    session = get_session(config, master).newSession()
    for key, value in spark_settings(config).items():
        if key.startswith("spark.sql."):
            session.conf.set(key, value)
    return session


def get_session(config: Mapping[str, str], master: str = "") -> Any:
    """This process's SparkSession, created on first use from ``config`` (and ``master``, the
    AppMaster's answer). A later job with other ``spark.*`` settings gets the same SparkContext
    (a JVM has one): its static settings (memory) are those of the first; a warning says which
    differ. A session whose master is gone (the AppMaster stopped an idle Spark cluster and
    started another), or is not the one a job names, is stopped and made anew (a stage of
    another job still running on it then fails and is retried). SQL settings are per stage
    (``stage_session``)."""
    global _session
    with _lock:
        settings = spark_settings(config, master)
        wanted, current_master = settings["spark.master"], _session.sparkContext.master if _session else ""
        if _session is not None and wanted != current_master \
                and not (wanted.startswith("local") and current_master.startswith("local")):
            log.info("the Spark master is now %s (was %s): starting a new SparkSession", settings["spark.master"],
                     _session.sparkContext.master)
            try:
                _session.stop()
            except Exception:  # noqa: BLE001 - its master is gone
                log.debug("stopping the old SparkSession", exc_info=True)
            _session = None
        if _session is not None:
            current = dict(_session.sparkContext.getConf().getAll())
            differ = sorted(k for k, v in settings.items() if k in current and current[k] != v
                            and not k.startswith(("spark.driver.host", "spark.sql.")))
            if differ:
                log.warning("this TaskExecutor's SparkSession keeps its settings for %s (a JVM has one "
                            "SparkContext); run the job on a new cluster to change them", ", ".join(differ))
            return _session
        if settings["spark.master"].startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        log.info("starting the SparkSession of this TaskExecutor (master %s, driver memory %s)",
                 settings["spark.master"], settings.get("spark.driver.memory"))
        builder = SparkSession.builder.appName(config.get("spark.app.name") or "yarnflow")
        for key, value in settings.items():
            builder = builder.config(key, value)
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel(config.get("spark.log.level") or "WARN")
        log.info("SparkSession started: application %s", _session.sparkContext.applicationId)
        return _session


def stop_session() -> None:
    """Stop this process's SparkSession if one was started (the TaskExecutor is stopping)."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        log.info("stopping the SparkSession (application %s)", session.sparkContext.applicationId)
        try:
            session.stop()
        except Exception:  # noqa: BLE001 - the JVM may be gone already
            log.warning("stopping the SparkSession failed", exc_info=True)


def memory_mb(value: str) -> int:
    """A Spark memory string (``512m``, ``2g``, ``1024``: MiB) in MiB."""
    text = value.strip().lower().rstrip("b")
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    if text and text[-1] in units:
        return max(1, int(float(text[:-1]) * units[text[-1]]))
    return int(float(text))


def error_line(exc: BaseException) -> str:
    """Spark's message without the JVM stack trace or the query plan: its first line."""
    try:
        text = str(exc.getMessage())  # type: ignore[attr-defined]  # PySpark's captured JVM errors
    except Exception:  # noqa: BLE001 - any other exception
        text = ""
    lines = [ln.strip() for ln in (text or str(exc)).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("An error occurred while calling") and len(lines) > 1:
        return lines[1]  # py4j's preamble; the Java exception's message follows
    return lines[0]
