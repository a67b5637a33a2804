"""``pyflink.datastream.execution_mode``."""

from yarnflow.pyflink.datastream.stream_execution_environment import RuntimeExecutionMode

__all__ = ["RuntimeExecutionMode"]
