"""Window assigners, watermark strategies and the user function bases for windows and keyed
processing, in one place: ``from yarnflow.windows import TumblingEventTimeWindows, ...``.
They are defined in ``yarnflow.common.api``, shared by the client and the TaskExecutors."""

from yarnflow.common.api import (
    EVENT_TIME,
    PROCESSING_TIME,
    AggregateFunction,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
    WindowAssigner,
)

__all__ = [
    "AggregateFunction",
    "KeyedProcessFunction",
    "EVENT_TIME",
    "PROCESSING_TIME",
    "WatermarkStrategy",
    "WindowAssigner",
    "TumblingEventTimeWindows",
    "SlidingEventTimeWindows",
    "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows",
    "SlidingProcessingTimeWindows",
    "ProcessingTimeSessionWindows",
]
