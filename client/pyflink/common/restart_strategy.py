"""``pyflink.common.restart_strategy``."""

from yarnflow.job_config import RestartStrategies, RestartStrategyConfiguration

__all__ = ["RestartStrategies", "RestartStrategyConfiguration"]
