"""How long a TaskExecutor and the tasks of a job whose JobMaster is gone wait for a new leader
(issue 50: with the default keys the README's high-availability session lost its TaskExecutors,
which gave up after 30 s while ZooKeeper kept the dead leader's session for up to 60 s)."""

from __future__ import annotations

import pytest

from yarnflow.common.config import Configuration
from yarnflow.worker.taskexecutor.task_executor import orphan_timeout_ms, registration_timeout_ms, takeover_ms

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

HA = {"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": "zk:2181",
      "high-availability.storageDir": "file:///shared"}


def test_without_high_availability_the_configured_timeouts_hold() -> None:
    config = Configuration.load({})
    assert takeover_ms(config) == 0
    assert registration_timeout_ms(config) == 30_000
    assert orphan_timeout_ms(config) == 5_000 + 10_000  # previous-worker recovery + heartbeat timeout


def test_with_high_availability_they_outlast_a_takeover_with_the_default_keys() -> None:
    config = Configuration.load(HA)
    # the dead leader's session expires (60 s), the next leader connects (15 s) and waits 5 s for them
    assert takeover_ms(config) == 60_000 + 15_000 + 5_000
    assert registration_timeout_ms(config) == 80_000 > 30_000
    assert orphan_timeout_ms(config) == 80_000


def test_a_shorter_session_timeout_shortens_the_wait_and_a_longer_configured_one_wins() -> None:
    short = Configuration.load({**HA, "high-availability.zookeeper.client.session-timeout": "5 s",
                                "high-availability.zookeeper.client.connection-timeout": "3 s"})
    assert registration_timeout_ms(short) == 30_000  # the configured 30 s already outlasts 5 + 3 + 5 s
    assert orphan_timeout_ms(short) == 15_000
    long = Configuration.load({**HA, "taskmanager.registration.timeout": "5 min"})
    assert registration_timeout_ms(long) == 300_000
