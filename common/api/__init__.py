"""The user-facing API types that the client (which builds a pipeline from them) and the
TaskExecutor (which runs them) both use: user function bases, keyed state descriptors,
window assigners and the watermark strategy.

They live here, on neither side, so that neither the client nor the worker reaches into the
other for them. Users import them from ``yarnflow`` (or ``yarnflow.windows``); the runtime
implementations (operators, state backends, timers) stay in ``yarnflow.worker``."""

from yarnflow.common.api.co_functions import (
    BroadcastProcessFunction,
    CheckpointedFunction,
    CoFlatMapFunction,
    CoMapFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    ProcessJoinFunction,
    SourceFunction,
)
from yarnflow.common.api.async_function import AsyncFunction
from yarnflow.common.api.functions import (EVENT_TIME, PROCESSING_TIME, AggregateFunction, KeyedProcessFunction,
                                          ProcessFunction)
from yarnflow.common.api.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateDescriptorError,
    StateError,
    ValueStateDescriptor,
)
from yarnflow.common.api.watermarks import WatermarkStrategy
from yarnflow.common.api.windows import (
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
    window_start_with_offset,
)

__all__ = [
    "EVENT_TIME",
    "PROCESSING_TIME",
    "AggregateFunction",
    "AsyncFunction",
    "BroadcastProcessFunction",
    "CheckpointedFunction",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CoProcessFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "EventTimeSessionWindows",
    "KeyedProcessFunction",
    "ProcessFunction",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ProcessJoinFunction",
    "ProcessingTimeSessionWindows",
    "ReducingStateDescriptor",
    "SlidingEventTimeWindows",
    "SourceFunction",
    "SlidingProcessingTimeWindows",
    "StateDescriptor",
    "StateDescriptorError",
    "StateError",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "ValueStateDescriptor",
    "WatermarkStrategy",
    "WindowAssigner",
    "window_start_with_offset",
]
