"""Where a TaskExecutor's Spark stages run Spark when their job names no ``spark.master``."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from yarnflow.common.config import Options
from yarnflow.common.config_types import parse_duration_ms
from yarnflow.common.errors import FencingTokenError, RpcConnectionError, RpcTimeoutError, UnavailableError

if TYPE_CHECKING:
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

log = logging.getLogger(__name__)


class SparkMasters:
    """A TaskExecutor's answer to where a Spark stage's Spark runs when its job names no
    ``spark.master`` (``worker.spark.MasterProvider``): asks the ResourceManager, polling while
    its Spark master starts (up to ``spark-stages.start-timeout``). While stages here hold the
    AppMaster's Spark cluster, a thread asks again every quarter of
    ``spark-stages.idle-timeout`` (at most every 10 s), which keeps the cluster from being
    stopped as idle under a long stage."""

    def __init__(self, te: TaskExecutor) -> None:
        self._te = te
        self._lock = threading.Lock()
        self._holders = 0
        self._settings: dict[str, str] = {}
        self._keepalive: threading.Thread | None = None

    def _ask(self, settings: dict[str, str]) -> str:
        rm, token = self._te._rm, self._te.core.rm_token
        if rm is None or not token:
            return ""
        try:
            return rm.request_spark_master(token, settings)
        except (FencingTokenError, UnavailableError, RpcConnectionError, RpcTimeoutError) as exc:
            log.info("asking for a Spark master: %s (asking again)", exc)
            return ""

    def acquire(self, settings: dict[str, str]) -> str:
        config = self._te.config
        timeout_ms = parse_duration_ms(settings.get(Options.SPARK_START_TIMEOUT.key)
                                       or config[Options.SPARK_START_TIMEOUT])
        deadline = time.monotonic() + timeout_ms / 1000
        while not (answer := self._ask(settings)):
            if time.monotonic() >= deadline or self._te._stopped.is_set():
                raise TimeoutError(f"the AppMaster's Spark master was not up within {timeout_ms} ms "
                                   "(spark-stages.start-timeout)")
            time.sleep(0.5)
        if answer.startswith("spark://"):
            with self._lock:
                self._holders += 1
                self._settings = dict(settings)
                if self._keepalive is None or not self._keepalive.is_alive():
                    self._keepalive = threading.Thread(target=self._keep, name="spark-keepalive", daemon=True)
                    self._keepalive.start()
        return answer

    def release(self) -> None:
        with self._lock:
            self._holders = max(0, self._holders - 1)

    def _keep(self) -> None:
        idle_ms = parse_duration_ms(self._settings.get(Options.SPARK_IDLE_TIMEOUT.key)
                                    or self._te.config[Options.SPARK_IDLE_TIMEOUT])
        period = min(10.0, max(0.2, idle_ms / 4000))
        while not self._te._stopped.wait(period):
            with self._lock:
                if not self._holders:
                    self._keepalive = None
                    return
                settings = dict(self._settings)
            self._ask(settings)
