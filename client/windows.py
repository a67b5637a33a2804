"""Window assigners, watermark strategies and the user function bases for windows and keyed
processing, in one place: ``from yarnflow.windows import TumblingEventTimeWindows, ...``."""

from yarnflow.worker.operators.functions import AggregateFunction
from yarnflow.worker.operators.timestamps import WatermarkStrategy
from yarnflow.worker.operators.windows import (
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)

__all__ = [
    "AggregateFunction",
    "WatermarkStrategy",
    "TumblingEventTimeWindows",
    "SlidingEventTimeWindows",
    "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows",
    "SlidingProcessingTimeWindows",
    "ProcessingTimeSessionWindows",
]
