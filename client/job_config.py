"""Configuring a job from its code, as Flink's (and PyFlink's) DataStream API does:

    env.enable_checkpointing(10_000)                       # ms
    env.get_checkpoint_config().enable_unaligned_checkpoints()
    env.set_state_backend(EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True))
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(3, 10_000))

Each call writes Flink's configuration keys (conf/yarnflow.yaml lists them) into the
environment's configuration, which the job is submitted with: what the code says wins over
``yarnflow run -D`` and the cluster's configuration file, as in Flink. A bad value is a
JobDefinitionError when the call is made, naming the call."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, MutableMapping

from yarnflow.common.errors import JobDefinitionError

__all__ = ["CheckpointingMode", "ExternalizedCheckpointCleanup", "ExternalizedCheckpointRetention", "CheckpointConfig",
           "HashMapStateBackend", "EmbeddedRocksDBStateBackend", "RestartStrategies", "RestartStrategyConfiguration"]


class CheckpointingMode(enum.Enum):
    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedCheckpointRetention(enum.Enum):
    """What happens to a job's checkpoints when it ends (Flink's names)."""

    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"


#: (Flink's former name of the same)
ExternalizedCheckpointCleanup = ExternalizedCheckpointRetention

_KEY = "execution.checkpointing."


def _ms(value: Any, what: str, minimum: int = 0) -> int:
    """Milliseconds from an int (as Flink's Java and Python APIs take them) or a timedelta."""
    if hasattr(value, "total_seconds"):
        value = int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobDefinitionError(f"{what} takes milliseconds (an int) or a timedelta, not {value!r}")
    if value < minimum:
        raise JobDefinitionError(f"{what} must be at least {minimum} ms, not {value}")
    return value


def _count(value: Any, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise JobDefinitionError(f"{what} takes a whole number of at least {minimum}, not {value!r}")
    return value


def _enum(cls: type[enum.Enum], value: Any, what: str) -> str:
    if isinstance(value, cls):
        return str(value.value)
    name = getattr(value, "name", value)  # (another module's enum of the same names)
    if isinstance(name, str) and name.upper() in cls.__members__:
        return str(cls[name.upper()].value)
    raise JobDefinitionError(f"{what} takes one of {', '.join(cls.__members__)}, not {value!r}")


class CheckpointConfig:
    """``env.get_checkpoint_config()``: the job's checkpointing, Flink's setters and getters
    over the environment's configuration (``execution.checkpointing.*``)."""

    def __init__(self, conf: MutableMapping[str, str]) -> None:
        self._conf = conf

    def _get(self, key: str, default: str) -> str:
        return self._conf.get(_KEY + key, default) or default

    # -- interval and mode
    def set_checkpoint_interval(self, interval_ms: Any) -> CheckpointConfig:
        self._conf[_KEY + "interval"] = f"{_ms(interval_ms, 'set_checkpoint_interval', minimum=10)} ms"
        return self

    def get_checkpoint_interval(self) -> int:
        """The interval in ms; -1 when checkpointing is off."""
        from yarnflow.common.config_types import parse_duration_ms

        raw = self._get("interval", "")
        return parse_duration_ms(raw) if raw else -1

    def is_checkpointing_enabled(self) -> bool:
        return self.get_checkpoint_interval() > 0

    def set_checkpointing_mode(self, mode: Any) -> CheckpointConfig:
        self._conf[_KEY + "mode"] = _enum(CheckpointingMode, mode, "set_checkpointing_mode")
        return self

    def get_checkpointing_mode(self) -> CheckpointingMode:
        return CheckpointingMode[self._get("mode", "EXACTLY_ONCE").upper()]

    # -- limits
    def set_checkpoint_timeout(self, timeout_ms: Any) -> CheckpointConfig:
        self._conf[_KEY + "timeout"] = f"{_ms(timeout_ms, 'set_checkpoint_timeout', minimum=1)} ms"
        return self

    def set_min_pause_between_checkpoints(self, pause_ms: Any) -> CheckpointConfig:
        self._conf[_KEY + "min-pause"] = f"{_ms(pause_ms, 'set_min_pause_between_checkpoints')} ms"
        return self

    def set_max_concurrent_checkpoints(self, n: int) -> CheckpointConfig:
        self._conf[_KEY + "max-concurrent-checkpoints"] = str(_count(n, "set_max_concurrent_checkpoints", 1))
        return self

    def set_tolerable_checkpoint_failure_number(self, n: int) -> CheckpointConfig:
        self._conf[_KEY + "tolerable-failed-checkpoints"] = str(_count(n, "set_tolerable_checkpoint_failure_number"))
        return self

    def set_num_retained_checkpoints(self, n: int) -> CheckpointConfig:  # (yarnflow's; Flink: a configuration key)
        self._conf[_KEY + "num-retained"] = str(_count(n, "set_num_retained_checkpoints", 1))
        return self

    # -- unaligned checkpoints
    def enable_unaligned_checkpoints(self, enabled: bool = True) -> CheckpointConfig:
        self._conf[_KEY + "unaligned.enabled"] = "true" if enabled else "false"
        return self

    def disable_unaligned_checkpoints(self) -> CheckpointConfig:
        return self.enable_unaligned_checkpoints(False)

    def is_unaligned_checkpoints_enabled(self) -> bool:
        return self._get("unaligned.enabled", "false").lower() == "true"

    def set_aligned_checkpoint_timeout(self, timeout_ms: Any) -> CheckpointConfig:
        self._conf[_KEY + "aligned-checkpoint-timeout"] = f"{_ms(timeout_ms, 'set_aligned_checkpoint_timeout')} ms"
        return self

    # -- where they go, and what is kept
    def set_checkpoint_storage_dir(self, uri: str) -> CheckpointConfig:
        if not isinstance(uri, str) or not uri:
            raise JobDefinitionError(f"set_checkpoint_storage_dir takes a folder's URL, not {uri!r}")
        self._conf[_KEY + "dir"] = uri
        return self

    def set_externalized_checkpoint_retention(self, retention: Any) -> CheckpointConfig:
        self._conf[_KEY + "externalized-checkpoint-retention"] = _enum(
            ExternalizedCheckpointRetention, retention, "set_externalized_checkpoint_retention")
        return self

    set_externalized_checkpoint_cleanup = set_externalized_checkpoint_retention
    enable_externalized_checkpoints = set_externalized_checkpoint_retention


@dataclass(frozen=True)
class HashMapStateBackend:
    """Keyed state in the TaskExecutor's memory (``state.backend.type: hashmap``)."""

    def configure(self, conf: MutableMapping[str, str]) -> None:
        conf["state.backend.type"] = "hashmap"


@dataclass(frozen=True)
class EmbeddedRocksDBStateBackend:
    """Keyed state in RocksDB on the TaskExecutor's disk (``state.backend.type: rocksdb``);
    incremental checkpoints upload only new files."""

    enable_incremental_checkpointing: bool = False

    def configure(self, conf: MutableMapping[str, str]) -> None:
        conf["state.backend.type"] = "rocksdb"
        conf[_KEY + "incremental"] = "true" if self.enable_incremental_checkpointing else "false"


@dataclass(frozen=True)
class RestartStrategyConfiguration:
    """A restart strategy as ``restart-strategy.*`` keys (``RestartStrategies`` makes them)."""

    settings: tuple[tuple[str, str], ...]

    def configure(self, conf: MutableMapping[str, str]) -> None:
        conf.update(dict(self.settings))

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings)


class RestartStrategies:
    """Flink's restart strategies, delays in milliseconds (ints) or timedeltas."""

    @staticmethod
    def no_restart() -> RestartStrategyConfiguration:
        return RestartStrategyConfiguration((("restart-strategy.type", "none"),))

    @staticmethod
    def fixed_delay_restart(restart_attempts: int, delay_between_attempts: Any) -> RestartStrategyConfiguration:
        p = "restart-strategy.fixed-delay."
        return RestartStrategyConfiguration((
            ("restart-strategy.type", "fixed-delay"),
            (p + "attempts", str(_count(restart_attempts, "fixed_delay_restart's restart_attempts"))),
            (p + "delay", f"{_ms(delay_between_attempts, 'fixed_delay_restart delay_between_attempts')} ms")))

    @staticmethod
    def failure_rate_restart(failure_rate: int, failure_interval: Any, delay_interval: Any
                             ) -> RestartStrategyConfiguration:
        p = "restart-strategy.failure-rate."
        return RestartStrategyConfiguration((
            ("restart-strategy.type", "failure-rate"),
            (p + "max-failures-per-interval", str(_count(failure_rate, "failure_rate_restart's failure_rate", 1))),
            (p + "failure-rate-interval", f"{_ms(failure_interval, 'failure_rate_restart failure_interval', 1)} ms"),
            (p + "delay", f"{_ms(delay_interval, 'failure_rate_restart delay_interval')} ms")))

    @staticmethod
    def exponential_delay_restart(initial_backoff: Any, max_backoff: Any, backoff_multiplier: float,
                                  reset_backoff_threshold: Any, jitter_factor: float) -> RestartStrategyConfiguration:
        p = "restart-strategy.exponential-delay."
        if not isinstance(backoff_multiplier, (int, float)) or backoff_multiplier < 1:
            raise JobDefinitionError(f"exponential_delay_restart's backoff_multiplier must be at least 1, "
                                     f"not {backoff_multiplier!r}")
        if not isinstance(jitter_factor, (int, float)) or not 0 <= jitter_factor <= 1:
            raise JobDefinitionError(f"exponential_delay_restart's jitter_factor must be in [0, 1], not {jitter_factor!r}")
        return RestartStrategyConfiguration((
            ("restart-strategy.type", "exponential-delay"),
            (p + "initial-backoff", f"{_ms(initial_backoff, 'exponential_delay_restart initial_backoff', 1)} ms"),
            (p + "max-backoff", f"{_ms(max_backoff, 'exponential_delay_restart max_backoff', 1)} ms"),
            (p + "backoff-multiplier", str(float(backoff_multiplier))),
            (p + "reset-backoff-threshold",
             f"{_ms(reset_backoff_threshold, 'exponential_delay_restart reset_backoff_threshold', 1)} ms"),
            (p + "jitter-factor", str(float(jitter_factor)))))

    @staticmethod
    def fall_back_restart() -> RestartStrategyConfiguration:
        """The cluster's configured strategy (nothing set by the job)."""
        return RestartStrategyConfiguration(())
