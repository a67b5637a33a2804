"""Restart strategies: may the job restart after a failure, and after how long (pure; time is
passed in, jitter comes from an injectable ``random.Random``), as Flink's
``RestartBackoffTimeStrategy`` family.

The scheduler calls ``notify_failure(now_ms)`` for each failure, then ``can_restart()``; when it
may, it waits ``backoff_ms()`` before restarting the tasks the failover strategy chose.

    restart-strategy.type      none (off, disable) | fixed-delay (fixeddelay)
                               | failure-rate (failurerate) | exponential-delay (exponentialdelay)

    fixed-delay        restart at most ``attempts`` times, ``delay`` after each failure.
    failure-rate       restart while at most ``max-failures-per-interval`` failures happened in
                       the last ``failure-rate-interval``; ``delay`` after each failure.
    exponential-delay  the backoff starts at ``initial-backoff`` and is multiplied by
                       ``backoff-multiplier`` per failure up to ``max-backoff``, +/- a
                       ``jitter-factor`` share; after the job ran ``reset-backoff-threshold``
                       without failing it starts again from the initial backoff. Failures that
                       arrive before the pending restart are merged into its attempt.
                       ``attempts-before-reset-backoff`` (empty: no limit) bounds the attempts
                       between two resets.
"""

from __future__ import annotations

import collections
import difflib
import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from yarnflow.common.config_types import _parse_float as _float
from yarnflow.common.config_types import _parse_int as _int
from yarnflow.common.config_types import parse_duration_ms
from yarnflow.common.errors import ConfigurationError

__all__ = [
    "ExponentialDelayRestartStrategy",
    "FailureRateRestartStrategy",
    "FixedDelayRestartStrategy",
    "NoRestartStrategy",
    "RestartStrategy",
    "make_restart_strategy",
    "max_memory_failures",
]

class RestartStrategy(Protocol):
    name: str

    def can_restart(self) -> bool:
        """May the job restart after the failures notified so far?"""
        ...

    def notify_failure(self, now_ms: int) -> bool:
        """Record a failure at ``now_ms``. False when it was merged into a pending restart."""
        ...

    def backoff_ms(self) -> int:
        """How long to wait, from the last notified failure, before restarting."""
        ...

    def describe(self) -> str:
        """One line for logs and the failure history."""
        ...


class NoRestartStrategy:
    """``none``: the first failure fails the job."""

    name = "none"

    def can_restart(self) -> bool:
        return False

    def notify_failure(self, now_ms: int) -> bool:
        return True

    def backoff_ms(self) -> int:
        return 0

    def describe(self) -> str:
        return "none: restarts are disabled"


class FixedDelayRestartStrategy:
    """``fixed-delay``: at most ``attempts`` restarts, each ``delay_ms`` after its failure."""

    name = "fixed-delay"

    def __init__(self, attempts: int, delay_ms: int) -> None:
        if attempts < 0 or delay_ms < 0:
            raise ValueError("attempts and delay cannot be negative")
        self.attempts = attempts
        self.delay_ms = delay_ms
        self.failures = 0

    def can_restart(self) -> bool:
        return self.failures <= self.attempts

    def notify_failure(self, now_ms: int) -> bool:
        self.failures += 1
        return True

    def backoff_ms(self) -> int:
        return self.delay_ms

    def describe(self) -> str:
        if not self.can_restart():
            return f"fixed-delay: all {self.attempts} attempts used, {self.failures} failures"
        return f"fixed-delay: {self.failures} of {self.attempts} attempts used, delay {self.delay_ms} ms"


class FailureRateRestartStrategy:
    """``failure-rate``: restart while at most ``max_failures`` failures (this one included)
    happened in the last ``interval_ms`` (a failure exactly ``interval_ms`` ago still counts)."""

    name = "failure-rate"

    def __init__(self, max_failures: int, interval_ms: int, delay_ms: int) -> None:
        if max_failures < 1 or interval_ms < 1 or delay_ms < 0:
            raise ValueError("need max_failures >= 1, interval_ms >= 1 and delay_ms >= 0")
        self.max_failures = max_failures
        self.interval_ms = interval_ms
        self.delay_ms = delay_ms
        self._window: collections.deque[int] = collections.deque()

    def can_restart(self) -> bool:
        return len(self._window) <= self.max_failures

    def notify_failure(self, now_ms: int) -> bool:
        window = self._window
        window.append(now_ms)
        while window and now_ms - window[0] > self.interval_ms:
            window.popleft()
        while len(window) > self.max_failures + 1:  # enough to know the rate is exceeded
            window.popleft()
        return True

    def backoff_ms(self) -> int:
        return self.delay_ms

    def describe(self) -> str:
        n = len(self._window)
        count = f"more than {self.max_failures}" if n > self.max_failures else f"{n} of {self.max_failures}"
        return f"failure-rate: {count} failures in the last {self.interval_ms} ms, delay {self.delay_ms} ms"


class ExponentialDelayRestartStrategy:
    """``exponential-delay``: see the module docstring. ``rng`` gives the jitter."""

    name = "exponential-delay"

    def __init__(self, initial_backoff_ms: int, max_backoff_ms: int, multiplier: float, reset_threshold_ms: int,
                 jitter_factor: float, attempts_before_reset: int | None = None,
                 rng: random.Random | None = None) -> None:
        if initial_backoff_ms < 1 or max_backoff_ms < initial_backoff_ms:
            raise ValueError("need 1 <= initial backoff <= max backoff")
        if multiplier < 1 or not 0 <= jitter_factor <= 1 or reset_threshold_ms < 1:
            raise ValueError("need multiplier >= 1, 0 <= jitter factor <= 1 and reset threshold >= 1 ms")
        if attempts_before_reset is not None and attempts_before_reset < 1:
            raise ValueError("attempts before reset must be at least 1")
        self.initial_backoff_ms = initial_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.multiplier = multiplier
        self.reset_threshold_ms = reset_threshold_ms
        self.jitter_factor = jitter_factor
        self.attempts_before_reset = attempts_before_reset
        self._rng = rng if rng is not None else random.Random()
        self.attempts = 0                        # since the last reset
        self._base_ms = initial_backoff_ms       # the backoff before jitter
        self._current_ms = initial_backoff_ms    # the backoff of the pending / last restart
        self._now_ms = 0
        self._next_restart_ms: int | None = None

    def can_restart(self) -> bool:
        return self.attempts_before_reset is None or self.attempts <= self.attempts_before_reset

    def notify_failure(self, now_ms: int) -> bool:
        self._now_ms = now_ms
        nxt = self._next_restart_ms
        if nxt is not None and now_ms < nxt:
            return False  # the job is not running again yet: same attempt
        if nxt is not None and now_ms - nxt >= self.reset_threshold_ms:
            self.attempts = 0
        if self.attempts == 0:
            self._base_ms = self.initial_backoff_ms
        else:
            self._base_ms = int(min(self._base_ms * self.multiplier, self.max_backoff_ms))
        offset = int(self._base_ms * self.jitter_factor)
        jitter = self._rng.randint(-offset, offset) if offset > 0 else 0
        self._current_ms = max(self.initial_backoff_ms, min(self._base_ms + jitter, self.max_backoff_ms))
        self.attempts += 1
        self._next_restart_ms = now_ms + self._current_ms
        return True

    def backoff_ms(self) -> int:
        if self._next_restart_ms is None:
            return self.initial_backoff_ms
        return max(0, self._next_restart_ms - self._now_ms)

    def describe(self) -> str:
        limit = "" if self.attempts_before_reset is None else f" of {self.attempts_before_reset}"
        return (f"exponential-delay: attempt {self.attempts}{limit}, backoff {self._current_ms} ms "
                f"(initial {self.initial_backoff_ms} ms, max {self.max_backoff_ms} ms, x{self.multiplier:g})")


# ---- configuration ------------------------------------------------------------------------------

_P = "restart-strategy."
_TYPE_KEY = _P + "type"
_TYPES = {"none": "none", "off": "none", "disable": "none",
          "fixed-delay": "fixed-delay", "fixeddelay": "fixed-delay",
          "failure-rate": "failure-rate", "failurerate": "failure-rate",
          "exponential-delay": "exponential-delay", "exponentialdelay": "exponential-delay"}


def _optional_int(value: Any) -> int | None:
    return None if value is None or str(value).strip() == "" else _int(value)


# key -> (parser, default, minimum)
_KEYS: dict[str, tuple[Callable[[Any], Any], Any, float | None]] = {
    _P + "fixed-delay.attempts": (_int, 1, 0),
    _P + "fixed-delay.delay": (parse_duration_ms, 1_000, 0),
    _P + "failure-rate.max-failures-per-interval": (_int, 1, 1),
    _P + "failure-rate.failure-rate-interval": (parse_duration_ms, 60_000, 1),
    _P + "failure-rate.delay": (parse_duration_ms, 1_000, 0),
    _P + "exponential-delay.initial-backoff": (parse_duration_ms, 1_000, 1),
    _P + "exponential-delay.max-backoff": (parse_duration_ms, 60_000, 1),
    _P + "exponential-delay.backoff-multiplier": (_float, 2.0, 1),
    _P + "exponential-delay.reset-backoff-threshold": (parse_duration_ms, 3_600_000, 1),
    _P + "exponential-delay.jitter-factor": (_float, 0.1, 0),
    _P + "exponential-delay.attempts-before-reset-backoff": (_optional_int, None, 1),
    _P + "max-memory-failures": (_int, 3, 0),
}


def _bad(key: str, value: Any, why: str) -> ConfigurationError:
    return ConfigurationError(f"bad value {value!r} for configuration key '{key}': {why}")


def _get(conf: Mapping[str, Any], key: str) -> Any:
    parse, default, minimum = _KEYS[key]
    if key not in conf:
        return default
    raw = conf[key]
    try:
        value = parse(raw)
    except ValueError as exc:
        raise _bad(key, raw, str(exc)) from None
    if value is not None and minimum is not None and value < minimum:
        raise _bad(key, raw, f"must be at least {minimum:g}")
    return value


def max_memory_failures(conf: Mapping[str, Any] | Any) -> int:
    """``restart-strategy.max-memory-failures`` of ``conf`` (0: no limit)."""
    values: Mapping[str, Any] = conf.to_strings() if hasattr(conf, "to_strings") else conf
    return int(_get(values, _P + "max-memory-failures"))


def make_restart_strategy(conf: Mapping[str, Any] | Any, rng: random.Random | None = None,
                          checkpointing: bool = False) -> RestartStrategy:
    """The restart strategy configured in ``conf``: a mapping of keys to raw values (strings
    from yaml or ``-D``), or a ``Configuration`` (its ``to_strings()`` are used). Keys outside
    ``restart-strategy.`` are ignored; a missing (or empty) type means Flink's default:
    ``exponential-delay`` for a job that takes checkpoints (``checkpointing``), which can resume
    from its latest one, ``none`` otherwise; missing options take Flink's defaults.

    Raises ``ConfigurationError`` naming the key for an unknown strategy, an unknown
    ``restart-strategy.*`` key or a bad value; the caller should report it and not start the job."""
    values: Mapping[str, Any] = conf.to_strings() if hasattr(conf, "to_strings") else conf
    for key in values:
        if key.startswith(_P) and key != _TYPE_KEY and key not in _KEYS:
            hint = difflib.get_close_matches(key, list(_KEYS), n=1)
            extra = f"; did you mean '{hint[0]}'?" if hint else ""
            raise ConfigurationError(f"unknown configuration key '{key}'{extra}")
    raw_type = values.get(_TYPE_KEY)
    if raw_type in (None, ""):
        kind: str | None = "exponential-delay" if checkpointing else "none"
    else:
        kind = _TYPES.get(str(raw_type).strip().lower())
    if kind is None:
        raise _bad(_TYPE_KEY, raw_type, "expected none, fixed-delay, failure-rate or exponential-delay")
    if kind == "none":
        return NoRestartStrategy()
    if kind == "fixed-delay":
        return FixedDelayRestartStrategy(_get(values, _P + "fixed-delay.attempts"),
                                         _get(values, _P + "fixed-delay.delay"))
    if kind == "failure-rate":
        return FailureRateRestartStrategy(_get(values, _P + "failure-rate.max-failures-per-interval"),
                                          _get(values, _P + "failure-rate.failure-rate-interval"),
                                          _get(values, _P + "failure-rate.delay"))
    e = _P + "exponential-delay."
    initial, maximum = _get(values, e + "initial-backoff"), _get(values, e + "max-backoff")
    if maximum < initial:
        raise _bad(e + "max-backoff", values.get(e + "max-backoff", "1 min"),
                   f"must not be below the initial backoff ({initial} ms)")
    jitter = _get(values, e + "jitter-factor")
    if jitter > 1:
        raise _bad(e + "jitter-factor", values.get(e + "jitter-factor"), "must be between 0 and 1")
    return ExponentialDelayRestartStrategy(initial, maximum, _get(values, e + "backoff-multiplier"),
                                           _get(values, e + "reset-backoff-threshold"), jitter,
                                           _get(values, e + "attempts-before-reset-backoff"), rng=rng)
