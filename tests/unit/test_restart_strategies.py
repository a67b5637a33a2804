"""Restart strategies (none, fixed-delay, failure-rate, exponential-delay), their configuration
with Flink's keys and defaults. Time comes from a ManualClock."""

from __future__ import annotations

import random

import pytest

from yarnflow.am.scheduler.restart import (
    ExponentialDelayRestartStrategy,
    FailureRateRestartStrategy,
    FixedDelayRestartStrategy,
    NoRestartStrategy,
    make_restart_strategy,
)
from yarnflow.common.clock import ManualClock
from yarnflow.common.config import Configuration
from yarnflow.common.errors import ConfigurationError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SECOND, MINUTE, HOUR = 1_000, 60_000, 3_600_000


def fail(strategy, clock: ManualClock, after_ms: int = 0) -> bool:  # type: ignore[no-untyped-def]
    """Advance the clock, notify a failure, answer whether the job may restart."""
    clock.advance(after_ms)
    strategy.notify_failure(clock.now_ms())
    return bool(strategy.can_restart())


# ---- none / fixed-delay -----------------------------------------------------------------------

def test_no_restart_strategy_never_restarts() -> None:
    strategy = NoRestartStrategy()
    assert fail(strategy, ManualClock()) is False
    assert strategy.backoff_ms() == 0 and strategy.describe().startswith("none")


def test_fixed_delay_counts_attempts() -> None:
    clock = ManualClock(1_000)
    strategy = FixedDelayRestartStrategy(attempts=3, delay_ms=5 * SECOND)
    assert strategy.can_restart()
    assert [fail(strategy, clock, 10 * MINUTE) for _ in range(3)] == [True, True, True]
    assert strategy.backoff_ms() == 5 * SECOND
    assert fail(strategy, clock, HOUR) is False  # attempts never come back, however long it ran
    assert "all 3 attempts used" in strategy.describe()


def test_fixed_delay_describe_counts_used_attempts() -> None:
    strategy = FixedDelayRestartStrategy(3, 10)
    fail(strategy, ManualClock())
    fail(strategy, ManualClock())
    assert strategy.describe() == "fixed-delay: 2 of 3 attempts used, delay 10 ms"


def test_fixed_delay_with_no_attempts_fails_on_the_first_failure() -> None:
    assert fail(FixedDelayRestartStrategy(0, 0), ManualClock()) is False


# ---- failure-rate -----------------------------------------------------------------------------

def test_failure_rate_allows_max_failures_per_interval() -> None:
    clock = ManualClock()
    strategy = FailureRateRestartStrategy(max_failures=3, interval_ms=10 * SECOND, delay_ms=2 * SECOND)
    assert [fail(strategy, clock) for _ in range(3)] == [True, True, True]
    assert strategy.describe() == "failure-rate: 3 of 3 failures in the last 10000 ms, delay 2000 ms"
    assert fail(strategy, clock) is False
    assert strategy.describe().startswith("failure-rate: more than 3 failures")
    assert strategy.backoff_ms() == 2 * SECOND


def test_failure_rate_window_slides() -> None:
    clock = ManualClock()
    strategy = FailureRateRestartStrategy(max_failures=2, interval_ms=1_000, delay_ms=0)
    assert fail(strategy, clock, 0) and fail(strategy, clock, 500)          # t=0, t=500
    assert fail(strategy, clock, 501) is True                               # t=1001: t=0 left the window
    assert fail(strategy, clock, 499) is False                              # t=1500: 500, 1001, 1500


def test_failure_rate_counts_a_failure_exactly_one_interval_ago() -> None:
    clock = ManualClock()
    strategy = FailureRateRestartStrategy(max_failures=1, interval_ms=1_000, delay_ms=0)
    assert fail(strategy, clock)
    assert fail(strategy, clock, 1_000) is False
    strategy = FailureRateRestartStrategy(max_failures=1, interval_ms=1, delay_ms=0)
    assert all(fail(strategy, clock, 2) for _ in range(5))  # Flink's testManyFailuresWithinRate


# ---- exponential-delay ------------------------------------------------------------------------

def exponential(jitter: float = 0.0, attempts: int | None = None, rng: random.Random | None = None,
                ) -> ExponentialDelayRestartStrategy:
    return ExponentialDelayRestartStrategy(initial_backoff_ms=SECOND, max_backoff_ms=10 * SECOND, multiplier=2.0,
                                           reset_threshold_ms=MINUTE, jitter_factor=jitter,
                                           attempts_before_reset=attempts, rng=rng)


def run_after_restart(strategy: ExponentialDelayRestartStrategy, clock: ManualClock, ran_ms: int) -> bool:
    """Wait out the backoff, let the job run ``ran_ms``, fail again."""
    return fail(strategy, clock, strategy.backoff_ms() + ran_ms)


def test_exponential_delay_grows_up_to_the_max() -> None:
    clock = ManualClock()
    strategy = exponential()
    assert strategy.backoff_ms() == SECOND
    assert fail(strategy, clock)
    backoffs = [strategy.backoff_ms()]
    for _ in range(6):
        assert run_after_restart(strategy, clock, 100)
        backoffs.append(strategy.backoff_ms())
    assert backoffs == [1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000]
    assert strategy.describe().startswith("exponential-delay: attempt 7, backoff 10000 ms")


def test_exponential_delay_resets_after_running_for_the_threshold() -> None:
    clock = ManualClock()
    strategy = exponential()
    fail(strategy, clock)
    run_after_restart(strategy, clock, 100)
    run_after_restart(strategy, clock, 100)
    assert strategy.backoff_ms() == 4_000 and strategy.attempts == 3
    run_after_restart(strategy, clock, MINUTE - 1)   # not quite long enough
    assert strategy.backoff_ms() == 8_000
    run_after_restart(strategy, clock, MINUTE)       # ran a full threshold since the restart
    assert strategy.backoff_ms() == 1_000 and strategy.attempts == 1


def test_exponential_delay_merges_failures_before_the_pending_restart() -> None:
    clock = ManualClock()
    strategy = exponential()
    fail(strategy, clock)
    assert strategy.notify_failure(clock.now_ms() + 400) is False  # a second task failed meanwhile
    assert strategy.attempts == 1 and strategy.backoff_ms() == 600  # the same restart, 600 ms away
    assert strategy.notify_failure(clock.now_ms() + 1_000) is True  # after the restart: a new attempt
    assert strategy.attempts == 2 and strategy.backoff_ms() == 2_000


def test_exponential_delay_attempts_before_reset() -> None:
    clock = ManualClock()
    strategy = exponential(attempts=2)
    assert fail(strategy, clock) and run_after_restart(strategy, clock, 100)
    assert strategy.describe().startswith("exponential-delay: attempt 2 of 2")
    assert run_after_restart(strategy, clock, 100) is False
    unlimited = exponential()
    assert all(fail(unlimited, clock, unlimited.backoff_ms() + 1) for _ in range(50))


def test_exponential_delay_jitter_stays_within_bounds_and_is_reproducible() -> None:
    def backoffs(seed: int) -> list[int]:
        clock = ManualClock()
        strategy = exponential(jitter=0.1, rng=random.Random(seed))
        fail(strategy, clock)
        out = [strategy.backoff_ms()]
        for _ in range(8):
            run_after_restart(strategy, clock, 1)
            out.append(strategy.backoff_ms())
        return out

    bases = [1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000, 10_000, 10_000]
    for seed in range(20):
        got = backoffs(seed)
        for value, base in zip(got, bases, strict=True):
            assert max(SECOND, base * 0.9) <= value <= min(10 * SECOND, base * 1.1)
    assert backoffs(7) == backoffs(7)
    assert len({tuple(backoffs(seed)) for seed in range(5)}) > 1  # the jitter does move


# ---- configuration ----------------------------------------------------------------------------

def test_missing_or_disabled_type_means_no_restart() -> None:
    assert isinstance(make_restart_strategy({}), NoRestartStrategy)
    for value in ("none", "off", "disable", "NONE", ""):
        assert isinstance(make_restart_strategy({"restart-strategy.type": value}), NoRestartStrategy)


def test_a_job_that_takes_checkpoints_restarts_by_default_as_in_flink() -> None:
    for conf in ({}, {"restart-strategy.type": ""}):
        strategy = make_restart_strategy(conf, checkpointing=True)
        assert isinstance(strategy, ExponentialDelayRestartStrategy) and strategy.attempts_before_reset is None
    for value in ("none", "off"):  # said so: no restart, checkpoints or not
        assert isinstance(make_restart_strategy({"restart-strategy.type": value}, checkpointing=True),
                          NoRestartStrategy)


@pytest.mark.parametrize("value", ["fixed-delay", "fixeddelay", "Fixed-Delay"])
def test_fixed_delay_defaults_and_aliases(value: str) -> None:
    strategy = make_restart_strategy({"restart-strategy.type": value})
    assert isinstance(strategy, FixedDelayRestartStrategy)
    assert (strategy.attempts, strategy.delay_ms) == (1, SECOND)


def test_fixed_delay_options() -> None:
    strategy = make_restart_strategy({"restart-strategy.type": "fixed-delay",
                                      "restart-strategy.fixed-delay.attempts": "3",
                                      "restart-strategy.fixed-delay.delay": "10 s",
                                      "parallelism.default": "4"})  # other keys are not ours
    assert isinstance(strategy, FixedDelayRestartStrategy)
    assert (strategy.attempts, strategy.delay_ms) == (3, 10 * SECOND)


@pytest.mark.parametrize("value", ["failure-rate", "failurerate"])
def test_failure_rate_defaults_and_options(value: str) -> None:
    strategy = make_restart_strategy({"restart-strategy.type": value})
    assert isinstance(strategy, FailureRateRestartStrategy)
    assert (strategy.max_failures, strategy.interval_ms, strategy.delay_ms) == (1, MINUTE, SECOND)
    strategy = make_restart_strategy({"restart-strategy.type": value,
                                      "restart-strategy.failure-rate.max-failures-per-interval": 5,
                                      "restart-strategy.failure-rate.failure-rate-interval": "5 min",
                                      "restart-strategy.failure-rate.delay": "250 ms"})
    assert isinstance(strategy, FailureRateRestartStrategy)
    assert (strategy.max_failures, strategy.interval_ms, strategy.delay_ms) == (5, 5 * MINUTE, 250)


@pytest.mark.parametrize("value", ["exponential-delay", "exponentialdelay"])
def test_exponential_delay_defaults(value: str) -> None:
    strategy = make_restart_strategy({"restart-strategy.type": value})
    assert isinstance(strategy, ExponentialDelayRestartStrategy)
    assert (strategy.initial_backoff_ms, strategy.max_backoff_ms, strategy.multiplier, strategy.reset_threshold_ms,
            strategy.jitter_factor, strategy.attempts_before_reset) == (SECOND, MINUTE, 2.0, HOUR, 0.1, None)


def test_exponential_delay_options_and_injected_random() -> None:
    conf = {"restart-strategy.type": "exponential-delay",
            "restart-strategy.exponential-delay.initial-backoff": "100 ms",
            "restart-strategy.exponential-delay.max-backoff": "2 s",
            "restart-strategy.exponential-delay.backoff-multiplier": "3",
            "restart-strategy.exponential-delay.reset-backoff-threshold": "10 min",
            "restart-strategy.exponential-delay.jitter-factor": "0.5",
            "restart-strategy.exponential-delay.attempts-before-reset-backoff": "4"}
    first = make_restart_strategy(conf, rng=random.Random(3))
    second = make_restart_strategy(conf, rng=random.Random(3))
    assert isinstance(first, ExponentialDelayRestartStrategy)
    assert (first.initial_backoff_ms, first.max_backoff_ms, first.multiplier, first.reset_threshold_ms,
            first.jitter_factor, first.attempts_before_reset) == (100, 2_000, 3.0, 10 * MINUTE, 0.5, 4)
    got = []
    for strategy in (first, second):
        clock = ManualClock()
        fail(strategy, clock)
        fail(strategy, clock, strategy.backoff_ms())
        got.append(strategy.backoff_ms())
    assert got[0] == got[1] and 150 <= got[0] <= 450


def test_empty_attempts_before_reset_means_no_limit() -> None:
    strategy = make_restart_strategy({"restart-strategy.type": "exponential-delay",
                                      "restart-strategy.exponential-delay.attempts-before-reset-backoff": ""})
    assert isinstance(strategy, ExponentialDelayRestartStrategy) and strategy.attempts_before_reset is None


@pytest.mark.parametrize("key, value", [
    ("restart-strategy.type", "sometimes"),
    ("restart-strategy.fixed-delay.attempts", "three"),
    ("restart-strategy.fixed-delay.attempts", "-1"),
    ("restart-strategy.fixed-delay.delay", "soon"),
    ("restart-strategy.failure-rate.max-failures-per-interval", "0"),
    ("restart-strategy.failure-rate.failure-rate-interval", "0 s"),
    ("restart-strategy.exponential-delay.initial-backoff", "1 week"),
    ("restart-strategy.exponential-delay.max-backoff", "10 ms"),
    ("restart-strategy.exponential-delay.backoff-multiplier", "0.5"),
    ("restart-strategy.exponential-delay.jitter-factor", "1.5"),
    ("restart-strategy.exponential-delay.jitter-factor", "x"),
    ("restart-strategy.exponential-delay.attempts-before-reset-backoff", "0"),
    ("restart-strategy.fixed-delay.attemps", "3"),  # unknown key
])
def test_bad_values_name_the_key(key: str, value: str) -> None:
    conf = {"restart-strategy.type": key.split(".")[1], key: value}  # the type of the key's strategy
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        make_restart_strategy(conf)


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'restart-strategy.fixed-delay.attempts'"):
        make_restart_strategy({"restart-strategy.fixed-delay.attemps": "3"})


def test_loaded_configuration_is_accepted() -> None:
    conf = Configuration.load({"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "4"})
    strategy = make_restart_strategy(conf)
    assert isinstance(strategy, FixedDelayRestartStrategy) and strategy.attempts == 4
    assert isinstance(make_restart_strategy(Configuration.load()), NoRestartStrategy)  # the shipped default


def test_all_lists_the_public_names() -> None:
    import inspect

    from yarnflow.am.scheduler import restart

    public = {name for name, obj in vars(restart).items()
              if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
              and obj.__module__ == restart.__name__}
    assert set(restart.__all__) == public
