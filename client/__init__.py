"""yarnflow: Apache Flink's runtime, rebuilt in Python, running on Hadoop YARN.

Build a pipeline with ``StreamExecutionEnvironment`` and run it with ``yarnflow run job.py``
(or plain ``python job.py`` for an embedded local cluster).

Names are imported lazily, so that ``yarnflow.am`` / ``yarnflow.worker`` processes and tools
such as the code generator do not pay for (or depend on) the client API."""

from __future__ import annotations

import importlib
from typing import Any

from yarnflow.common.version import __version__

_EXPORTS = {
    "StreamExecutionEnvironment": "yarnflow.datastream",
    "DataStream": "yarnflow.datastream",
    "KeyedStream": "yarnflow.datastream",
    "JobExecutionResult": "yarnflow.executors",
    # user functions, keyed state, event time and windows (yarnflow.windows has them too)
    "AggregateFunction": "yarnflow.common.api",
    "KeyedProcessFunction": "yarnflow.common.api",
    "ProcessFunction": "yarnflow.common.api",
    "CoMapFunction": "yarnflow.common.api",
    "CoFlatMapFunction": "yarnflow.common.api",
    "CoProcessFunction": "yarnflow.common.api",
    "KeyedCoProcessFunction": "yarnflow.common.api",
    "BroadcastProcessFunction": "yarnflow.common.api",
    "KeyedBroadcastProcessFunction": "yarnflow.common.api",
    "CheckpointedFunction": "yarnflow.common.api",
    "ProcessJoinFunction": "yarnflow.common.api",
    "AsyncFunction": "yarnflow.common.api",
    "SourceFunction": "yarnflow.common.api",
    "AsyncDataStream": "yarnflow.async_io",
    "ValueStateDescriptor": "yarnflow.common.api",
    "ListStateDescriptor": "yarnflow.common.api",
    "MapStateDescriptor": "yarnflow.common.api",
    "ReducingStateDescriptor": "yarnflow.common.api",
    "WatermarkStrategy": "yarnflow.common.api",
    "TumblingEventTimeWindows": "yarnflow.common.api",
    "SlidingEventTimeWindows": "yarnflow.common.api",
    "EventTimeSessionWindows": "yarnflow.common.api",
    "TumblingProcessingTimeWindows": "yarnflow.common.api",
    "SlidingProcessingTimeWindows": "yarnflow.common.api",
    "ProcessingTimeSessionWindows": "yarnflow.common.api",
    # configuring the job from its code (Flink's names)
    "CheckpointingMode": "yarnflow.job_config",
    "CheckpointConfig": "yarnflow.job_config",
    "ExternalizedCheckpointRetention": "yarnflow.job_config",
    "HashMapStateBackend": "yarnflow.job_config",
    "EmbeddedRocksDBStateBackend": "yarnflow.job_config",
    "RestartStrategies": "yarnflow.job_config",
    "YarnflowError": "yarnflow.common.errors",
    "ConfigurationError": "yarnflow.common.errors",
    "JobDefinitionError": "yarnflow.common.errors",
    "JobFailedError": "yarnflow.common.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'yarnflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
