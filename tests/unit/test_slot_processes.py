"""What a worker of slot processes gives each of them (``worker/slot_processes.py``): when it runs
them at all (``taskmanager.slot-processes``: true, false, or auto: in a YARN container only),
one slot and an equal share of the memory and cores each, and their command lines."""

from __future__ import annotations

import pytest

from yarnflow.common.config import Configuration
from yarnflow.common.errors import ConfigurationError
from yarnflow.worker.slot_processes import LAUNCHER_RESERVE_BYTES, slot_commands, slot_overrides, wanted

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

YARN = {"CONTAINER_ID": "container_1_0001_01_000002"}


@pytest.mark.parametrize(("setting", "env", "slots", "expected"), [
    ("auto", YARN, "2", True),     # a YARN container granted a vcore per slot
    ("auto", {}, "2", False),      # a local cluster: threads (its default layout is a process a slot)
    ("true", {}, "2", True),
    ("false", YARN, "2", False),
    ("TRUE", {}, "4", True),
    ("true", YARN, "1", False),    # one slot: nothing to split
])
def test_when_a_worker_runs_slot_processes(setting, env, slots, expected) -> None:
    config = Configuration.load({"taskmanager.slot-processes": setting, "taskmanager.numberOfTaskSlots": slots})
    assert wanted(config, env) is expected


def test_a_bad_value_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigurationError, match="taskmanager.slot-processes"):
        Configuration.load({"taskmanager.slot-processes": "sometimes"})


def test_each_slot_process_gets_one_slot_and_an_equal_share_of_memory_and_cores() -> None:
    config = Configuration.load({"taskmanager.numberOfTaskSlots": "4", "taskmanager.memory.process.size": "2 gb",
                                 "taskmanager.cpu.cores": "4", "taskmanager.memory.managed.size": "400 mb"})
    out = slot_overrides(config)
    assert out["taskmanager.numberOfTaskSlots"] == "1" and out["taskmanager.slot-processes"] == "false"
    assert int(out["taskmanager.memory.process.size"]) == (2 * 2**30 - LAUNCHER_RESERVE_BYTES) // 4
    assert float(out["taskmanager.cpu.cores"]) == 1.0
    assert int(out["taskmanager.memory.managed.size"]) == 100 * 2**20
    assert "taskmanager.memory.task.off-heap.size" not in out  # not set: nothing to split


def test_cores_default_to_one_per_slot_and_may_be_fractions() -> None:
    assert float(slot_overrides(Configuration.load({"taskmanager.numberOfTaskSlots": "2"}))
                 ["taskmanager.cpu.cores"]) == 1.0
    assert float(slot_overrides(Configuration.load({"taskmanager.numberOfTaskSlots": "4", "taskmanager.cpu.cores": "2"}))
                 ["taskmanager.cpu.cores"]) == 0.5


def test_slot_commands_name_the_worker_and_put_the_shares_after_the_users_options() -> None:
    config = Configuration.load({"taskmanager.numberOfTaskSlots": "2", "taskmanager.slot-processes": "true"})
    commands = slot_commands(config, "container_7", "127.0.0.1:6123", "/work", ["taskmanager.numberOfTaskSlots=2"])
    assert [rid for rid, _ in commands] == ["container_7-s0", "container_7-s1"]
    rid, cmd = commands[1]
    assert cmd[cmd.index("--container-id") + 1] == "container_7"
    assert cmd[cmd.index("--work-dir") + 1] == "/work/s1"
    assert cmd[cmd.index("--rm-address") + 1] == "127.0.0.1:6123"
    pairs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-D"]
    # the user's 2 slots come first; the slot process's own 1 after it, so it wins
    assert pairs.index("taskmanager.numberOfTaskSlots=2") < pairs.index("taskmanager.numberOfTaskSlots=1")
