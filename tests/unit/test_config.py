"""Configuration: defaults, the shipped yaml, -D overrides, user files, units and errors."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from yarnflow.common.config import (
    NOT_SUPPORTED_YET,
    OPTIONS,
    Configuration,
    Options,
    parse_duration_ms,
    parse_dynamic_properties,
    parse_size_bytes,
    taskexecutor_cores,
)
from yarnflow.common.errors import ConfigurationError, YarnflowError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture(autouse=True)
def _no_conf_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """A YARNFLOW_CONF_DIR in the developer's environment must not leak into these tests."""
    monkeypatch.delenv("YARNFLOW_CONF_DIR", raising=False)


def _shipped_yaml() -> dict:
    text = resources.files("yarnflow.conf").joinpath("yarnflow.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


# ---- defaults and the shipped yaml --------------------------------------------------------

def test_defaults_load_with_typed_values() -> None:
    conf = Configuration.load()
    assert conf[Options.NUM_SLOTS] == 1
    assert conf[Options.HEARTBEAT_INTERVAL] == 1_000
    assert conf[Options.HEARTBEAT_TIMEOUT] == 10_000
    assert conf[Options.BUFFER_TIMEOUT] == 100
    assert conf[Options.TM_MEMORY] == 1 << 30
    assert conf[Options.TM_CPU] == 0.0 and taskexecutor_cores(conf) == 1.0  # one per slot
    assert taskexecutor_cores(Configuration.load({"taskmanager.numberOfTaskSlots": "3"})) == 3.0
    assert taskexecutor_cores(Configuration.load({"taskmanager.numberOfTaskSlots": "3",
                                                  "taskmanager.cpu.cores": "1.5"})) == 1.5
    assert conf[Options.HA_TYPE] == "none"
    assert conf[Options.RUNTIME_MODE] == "AUTOMATIC"
    assert conf[Options.RPC_PORT] == 0
    assert conf[Options.HA_STORAGE_DIR] == ""
    assert conf[Options.SPARK_MASTER] == ""  # local[N] in the TaskExecutor
    assert conf.get("parallelism.default") == 1


def test_failover_strategy_defaults_to_region_as_in_flink() -> None:
    assert Configuration.load()[Options.FAILOVER_STRATEGY] == "region"
    assert _shipped_yaml()["jobmanager.execution.failover-strategy"] == "region"
    assert Configuration.load({"jobmanager.execution.failover-strategy": "full"})[Options.FAILOVER_STRATEGY] == "full"


def test_every_option_has_a_default_in_the_yaml_and_vice_versa() -> None:
    shipped = _shipped_yaml()
    assert isinstance(shipped, dict)
    missing_from_yaml = sorted(set(OPTIONS) - set(shipped))
    unknown_in_yaml = sorted(set(shipped) - set(OPTIONS))
    assert missing_from_yaml == [], f"options without a default in conf/yarnflow.yaml: {missing_from_yaml}"
    assert unknown_in_yaml == [], f"keys in conf/yarnflow.yaml that are not options: {unknown_in_yaml}"


def test_every_shipped_default_converts() -> None:
    for key, raw in _shipped_yaml().items():
        OPTIONS[key].convert(raw)  # raises on a default of the wrong type


def test_options_are_unique_and_described() -> None:
    declared = [o for cls in Options.__mro__ for o in vars(cls).values() if hasattr(o, "key")]
    assert len({o.key for o in declared}) == len(declared) == len(OPTIONS)
    for option in declared:
        assert option.description, option.key


# ---- -D overrides -------------------------------------------------------------------------

def test_parse_dynamic_properties() -> None:
    assert parse_dynamic_properties([]) == {}
    assert parse_dynamic_properties(
        ["heartbeat.interval=2 s", " taskmanager.numberOfTaskSlots = 4 ", "io.tmp.dirs=", "a=b=c"]
    ) == {"heartbeat.interval": "2 s", "taskmanager.numberOfTaskSlots": "4", "io.tmp.dirs": "", "a": "b=c"}


def test_parse_dynamic_properties_later_entry_wins() -> None:
    assert parse_dynamic_properties(["parallelism.default=1", "parallelism.default=3"]) == {
        "parallelism.default": "3"}


@pytest.mark.parametrize("bad", ["heartbeat.interval", "=5", "  =5", ""])
def test_parse_dynamic_properties_rejects_entries_without_key_value(bad: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_dynamic_properties(["parallelism.default=2", bad])
    assert repr(bad) in str(info.value)
    assert "key=value" in str(info.value)


def test_overrides_apply_on_top_of_defaults() -> None:
    conf = Configuration.load(parse_dynamic_properties(
        ["heartbeat.interval=250 ms", "taskmanager.numberOfTaskSlots=8",
         "jobmanager.execution.failover-strategy=Full", "execution.runtime-mode=batch"]))
    assert conf[Options.HEARTBEAT_INTERVAL] == 250
    assert conf[Options.NUM_SLOTS] == 8
    assert conf[Options.FAILOVER_STRATEGY] == "full"  # choices are case-insensitive, canonicalised
    assert conf[Options.RUNTIME_MODE] == "BATCH"
    assert conf[Options.HEARTBEAT_TIMEOUT] == 10_000  # untouched


def test_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigurationError) as info:
        Configuration.load({"heartbeat.intervall": "1 s"})
    msg = str(info.value)
    assert "'heartbeat.intervall'" in msg
    assert "did you mean 'heartbeat.interval'" in msg
    assert "-D" in msg  # where it came from


def test_unknown_key_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(ConfigurationError) as info:
        Configuration.load({"zzzz": "1"})
    assert "'zzzz'" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_configuration_error_is_a_value_error_and_a_yarnflow_error() -> None:
    with pytest.raises(ValueError):
        Configuration.load({"nope.nope": "1"})
    with pytest.raises(YarnflowError):
        Configuration.load({"nope.nope": "1"})


@pytest.mark.parametrize(("key", "value", "why"), [
    ("heartbeat.interval", "abc", "duration"),
    ("heartbeat.timeout", "10 parsecs", "duration"),
    ("heartbeat.interval", "-5 s", "duration"),
    ("heartbeat.interval", -5, "negative"),
    ("heartbeat.interval", True, "duration"),
    ("taskmanager.numberOfTaskSlots", "0", "at least 1"),
    ("taskmanager.numberOfTaskSlots", "two", "integer"),
    ("taskmanager.numberOfTaskSlots", 2.5, "integer"),
    ("taskmanager.numberOfTaskSlots", True, "integer"),
    ("taskmanager.numberOfTaskSlots", None, "integer"),
    ("high-availability.type", "foo", "none, zookeeper"),
    ("jobmanager.execution.failover-strategy", "partial", "full, region"),
    ("jobmanager.rpc.port", "-1", "at least 0"),
    ("taskmanager.cpu.cores", "lots", "number"),
    ("taskmanager.cpu.cores", "-1", "at least 0"),
    ("taskmanager.memory.process.size", "1 tb", "size"),
    ("taskmanager.memory.process.size", -1, "negative"),
    ("taskmanager.memory.process.size", "much", "size"),
])
def test_bad_value_names_the_key(key: str, value: object, why: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Configuration.load({key: value}, source="-D (test)")
    msg = str(info.value)
    assert f"'{key}'" in msg
    assert repr(value) in msg
    assert "-D (test)" in msg
    assert why in msg


# ---- units --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ms"), [
    ("10 s", 10_000), ("10s", 10_000), ("500 ms", 500), ("1 min", 60_000), ("2m", 120_000),
    ("1 h", 3_600_000), ("1.5 s", 1_500), ("3 sec", 3_000), (" 7 S ", 7_000), ("250", 250),
    (250, 250), (0, 0), ("0 s", 0),
])
def test_durations_parse_with_units(text: object, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "s", "ten s", "10 days", "-1 s", "1e3", -1, True, None])
def test_bad_durations_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)


@pytest.mark.parametrize(("text", "size"), [
    ("1 gb", 1 << 30), ("1g", 1 << 30), ("512 mb", 512 << 20), ("512M", 512 << 20),
    ("64 kb", 64 << 10), ("64k", 64 << 10), ("100 b", 100), ("100", 100), (4096, 4096),
    ("1.5 gb", 3 << 29), (0, 0),
])
def test_sizes_parse_with_units(text: object, size: int) -> None:
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize("bad", ["", "mb", "1 tb", "big", "-1 mb", -1, True, None])
def test_bad_sizes_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size_bytes(bad)


def test_units_reach_typed_options() -> None:
    conf = Configuration.load({"taskmanager.memory.process.size": "2 gb", "rpc.timeout": "1 min",
                               "execution.buffer-timeout": 5})
    assert conf[Options.TM_MEMORY] == 2 << 30
    assert conf[Options.RPC_TIMEOUT] == 60_000
    assert conf[Options.BUFFER_TIMEOUT] == 5


# ---- a user configuration file ------------------------------------------------------------

def test_user_conf_file_overrides_defaults_and_is_overridden_by_d(tmp_path) -> None:
    path = tmp_path / "yarnflow.yaml"
    path.write_text("taskmanager.numberOfTaskSlots: 6\nheartbeat.interval: 3 s\n")
    conf = Configuration.load({"heartbeat.interval": "4 s"}, conf_file=str(path))
    assert conf[Options.NUM_SLOTS] == 6
    assert conf[Options.HEARTBEAT_INTERVAL] == 4_000
    assert conf[Options.HEARTBEAT_TIMEOUT] == 10_000


def test_empty_user_conf_file_means_defaults(tmp_path) -> None:
    path = tmp_path / "yarnflow.yaml"
    path.write_text("# nothing here\n")
    assert Configuration.load(conf_file=str(path)).to_strings() == Configuration.load().to_strings()


def test_conf_dir_from_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "yarnflow.yaml").write_text("parallelism.default: 5\n")
    monkeypatch.setenv("YARNFLOW_CONF_DIR", str(tmp_path))
    assert Configuration.load()[Options.PARALLELISM] == 5


def test_user_conf_file_with_bad_yaml(tmp_path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("heartbeat.interval: [1 s\n")
    with pytest.raises(ConfigurationError) as info:
        Configuration.load(conf_file=str(path))
    assert str(path) in str(info.value)
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_user_conf_file_that_is_not_a_mapping(tmp_path, text: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as info:
        Configuration.load(conf_file=str(path))
    assert str(path) in str(info.value)
    assert "mapping" in str(info.value)


def test_user_conf_file_with_unknown_key_names_key_and_file(tmp_path) -> None:
    path = tmp_path / "yarnflow.yaml"
    path.write_text("taskmanager.numberOfTaskSlot: 4\n")
    with pytest.raises(ConfigurationError) as info:
        Configuration.load(conf_file=str(path))
    msg = str(info.value)
    assert "'taskmanager.numberOfTaskSlot'" in msg
    assert str(path) in msg
    assert "did you mean 'taskmanager.numberOfTaskSlots'" in msg


def test_user_conf_file_with_bad_value_names_key_and_file(tmp_path) -> None:
    path = tmp_path / "yarnflow.yaml"
    path.write_text("heartbeat.timeout: soon\n")
    with pytest.raises(ConfigurationError) as info:
        Configuration.load(conf_file=str(path))
    assert "'heartbeat.timeout'" in str(info.value)
    assert str(path) in str(info.value)


def test_missing_user_conf_file(tmp_path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigurationError) as info:
        Configuration.load(conf_file=str(path))
    assert str(path) in str(info.value)


# ---- keys accepted before their feature exists: refused, not ignored ---------------------

def test_keys_of_missing_features_are_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(NOT_SUPPORTED_YET, "spark.future.", "the future is not implemented")
    with pytest.raises(ConfigurationError) as info:
        Configuration.load({"spark.future.knob": 2}, source="-D (test)")
    msg = str(info.value)
    assert msg.startswith("spark.future.knob: not supported yet ("), msg
    assert "the future is not implemented" in msg and "leave it unset" in msg, msg
    assert "2" in msg and "-D (test)" in msg, msg
    assert "\n" not in msg
    with pytest.raises(ConfigurationError, match="not supported yet") as info:
        Configuration.load().with_overrides({"spark.future.knob": "1"}, source="job config")
    assert "job config" in str(info.value)


def test_spark_keys_pass_through_to_the_spark_stages(tmp_path) -> None:
    path = tmp_path / "yarnflow.yaml"
    path.write_text("spark.executor.memory: 2g\nspark.sql.shuffle.partitions: 8\n")
    conf = Configuration.load({"spark.master": "yarn"}, conf_file=str(path))
    assert conf[Options.SPARK_MASTER] == "yarn"
    assert conf.spark_conf() == {"spark.master": "yarn", "spark.executor.memory": "2g",
                                 "spark.sql.shuffle.partitions": "8"}


def test_the_shipped_spark_defaults_load(tmp_path) -> None:
    shipped = _shipped_yaml()
    defaults = {k: v for k, v in shipped.items() if k.startswith("spark.")}
    assert set(defaults) >= {"spark.master"}
    conf = Configuration.load(defaults)  # the shipped defaults, restated: accepted
    assert conf[Options.SPARK_MASTER] == ""  # local[N], N = the TaskExecutor's cores
    path = tmp_path / "yarnflow.yaml"  # a user file that copies the shipped one
    path.write_text(resources.files("yarnflow.conf").joinpath("yarnflow.yaml").read_text(encoding="utf-8"))
    assert Configuration.load(conf_file=str(path)).to_strings() == Configuration.load().to_strings()


def test_keys_that_work_are_not_listed_as_unsupported() -> None:
    conf = Configuration.load({"high-availability.storageDir": "file:///tmp/yarnflow-storage",
                               "high-availability.type": "ZooKeeper", "high-availability.zookeeper.quorum": "zk:2181",
                               "high-availability.zookeeper.client.tolerate-suspended-connections": "true"})
    assert conf[Options.HA_STORAGE_DIR] == "file:///tmp/yarnflow-storage"
    assert conf[Options.HA_TYPE] == "zookeeper" and conf[Options.ZK_TOLERATE_SUSPENDED] is True
    with pytest.raises(ConfigurationError, match="tolerate-suspended-connections.*true or false"):
        Configuration.load({"high-availability.zookeeper.client.tolerate-suspended-connections": "maybe"})
    for key in NOT_SUPPORTED_YET:
        assert key in OPTIONS or key.endswith("."), f"{key}: neither an option nor a prefix"


# ---- with_overrides, to_strings -----------------------------------------------------------

def test_get_of_an_unknown_key_raises() -> None:
    with pytest.raises(ConfigurationError) as info:
        Configuration.load().get("no.such.key")
    assert "'no.such.key'" in str(info.value)


def test_with_overrides_returns_a_new_configuration() -> None:
    base = Configuration.load({"parallelism.default": "3"})
    changed = base.with_overrides({"taskmanager.numberOfTaskSlots": "4", "heartbeat.interval": "2 s"})
    assert changed[Options.NUM_SLOTS] == 4
    assert changed[Options.HEARTBEAT_INTERVAL] == 2_000
    assert changed[Options.PARALLELISM] == 3  # kept from the base
    assert base[Options.NUM_SLOTS] == 1  # the base is unchanged
    assert base[Options.HEARTBEAT_INTERVAL] == 1_000


def test_with_overrides_reports_bad_keys_and_values_with_their_source() -> None:
    base = Configuration.load()
    with pytest.raises(ConfigurationError) as info:
        base.with_overrides({"heartbeat.interval": "abc"}, source="job config")
    assert "'heartbeat.interval'" in str(info.value)
    assert "job config" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        base.with_overrides({"heartbeat.intrval": "1 s"})
    assert "did you mean 'heartbeat.interval'" in str(info.value)


def test_to_strings_round_trips_through_load() -> None:
    conf = Configuration.load({"heartbeat.interval": "250 ms", "taskmanager.memory.process.size": "3 gb",
                               "taskmanager.cpu.cores": 1.5, "jobmanager.execution.failover-strategy": "full",
                               "high-availability.storageDir": "file:///tmp/s", "jobmanager.rpc.port": 6123})
    strings = conf.to_strings()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in strings.items())
    # as it ships to another process: -D key=value pairs
    again = Configuration.load(parse_dynamic_properties(f"{k}={v}" for k, v in strings.items()))
    for option in OPTIONS.values():
        assert again[option] == conf[option], option.key
    assert again.spark_conf() == conf.spark_conf()
    assert again.to_strings() == strings


def test_a_buffer_timeout_of_minus_one_is_accepted_as_in_flink() -> None:
    """``execution.buffer-timeout: -1``: flush only when full (issue 51); other negatives are errors."""
    assert Configuration.load({"execution.buffer-timeout": "-1"})[Options.BUFFER_TIMEOUT] == -1
    assert Configuration.load({"execution.buffer-timeout": "250 ms"})[Options.BUFFER_TIMEOUT] == 250
    with pytest.raises(ConfigurationError, match="execution.buffer-timeout"):
        Configuration.load({"execution.buffer-timeout": "-5"})
