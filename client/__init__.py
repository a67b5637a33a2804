"""yarnflow: Apache Flink's runtime, rebuilt in Python, running on Hadoop YARN.

Build a pipeline with ``StreamExecutionEnvironment`` and run it with ``yarnflow run job.py``
(or plain ``python job.py`` for an embedded local cluster)."""

__version__ = "0.1.0"

from yarnflow.common.errors import (  # noqa: E402
    ConfigurationError,
    JobDefinitionError,
    JobFailedError,
    YarnflowError,
)
from yarnflow.datastream import DataStream, KeyedStream, StreamExecutionEnvironment  # noqa: E402
from yarnflow.executors import JobExecutionResult  # noqa: E402

__all__ = [
    "__version__",
    "StreamExecutionEnvironment",
    "DataStream",
    "KeyedStream",
    "JobExecutionResult",
    "YarnflowError",
    "ConfigurationError",
    "JobDefinitionError",
    "JobFailedError",
]
