"""``pyflink.datastream.window``: PyFlink's window assigners (sizes as ``Time``, ``Duration`` or
ms), each made yarnflow's own (``yarnflow_assigner``)."""

from __future__ import annotations

from typing import Any

from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.time import to_millis

__all__ = ["TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
           "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
           "CountTumblingWindowAssigner", "CountSlidingWindowAssigner", "TimeWindow", "CountWindow",
           "SessionWindowTimeGapExtractor", "Trigger", "EventTimeTrigger", "ProcessingTimeTrigger", "CountTrigger",
           "PurgingTrigger"]


def _ms(value: Any, what: str) -> int:
    try:
        return to_millis(value, what)
    except TypeError as exc:
        raise JobDefinitionError(str(exc)) from None


class _Assigner:
    ours = ""

    def __init__(self, *args: int) -> None:
        self.args = args

    def _yarnflow(self) -> Any:
        import yarnflow.common.api as api

        try:
            return getattr(api, self.ours)(*self.args)
        except ValueError as exc:
            raise JobDefinitionError(f"{type(self).__name__}: {exc}") from None


class _Fixed(_Assigner):
    @classmethod
    def of(cls, size: Any, offset: Any = None) -> Any:
        return cls(_ms(size, cls.__name__), *([_ms(offset, cls.__name__)] if offset is not None else []))


class _Slide(_Assigner):
    @classmethod
    def of(cls, size: Any, slide: Any, offset: Any = None) -> Any:
        return cls(_ms(size, cls.__name__), _ms(slide, cls.__name__),
                   *([_ms(offset, cls.__name__)] if offset is not None else []))


class _Gap:
    """A SessionWindowTimeGapExtractor (``extract(element)``, ms) as yarnflow's gap of a row."""

    def __init__(self, extractor: Any) -> None:
        self.extract = getattr(extractor, "extract", extractor)
        if not callable(self.extract):
            raise JobDefinitionError(f"with_dynamic_gap takes a SessionWindowTimeGapExtractor, not {extractor!r}")

    def __call__(self, row: dict[str, Any]) -> int:
        from yarnflow.pyflink.datastream.records import decode

        return int(self.extract(decode(row)))


class _Session(_Assigner):
    @classmethod
    def with_gap(cls, size: Any) -> Any:
        return cls(_ms(size, cls.__name__))

    @classmethod
    def with_dynamic_gap(cls, extractor: Any) -> Any:
        """Each element's gap from ``extractor.extract(element)`` (ms)."""
        return _DynamicSession(cls.ours, _Gap(extractor))


class _DynamicSession(_Assigner):
    def __init__(self, ours: str, gap: _Gap) -> None:
        super().__init__()
        self.ours, self.gap = ours, gap

    def _yarnflow(self) -> Any:
        import yarnflow.common.api as api

        return getattr(api, self.ours).with_dynamic_gap(self.gap)


class SessionWindowTimeGapExtractor:
    def extract(self, element: Any) -> int:
        raise NotImplementedError


class TumblingEventTimeWindows(_Fixed):
    ours = "TumblingEventTimeWindows"


class TumblingProcessingTimeWindows(_Fixed):
    ours = "TumblingProcessingTimeWindows"


class SlidingEventTimeWindows(_Slide):
    ours = "SlidingEventTimeWindows"


class SlidingProcessingTimeWindows(_Slide):
    ours = "SlidingProcessingTimeWindows"


class EventTimeSessionWindows(_Session):
    ours = "EventTimeSessionWindows"


class ProcessingTimeSessionWindows(_Session):
    ours = "ProcessingTimeSessionWindows"


class CountTumblingWindowAssigner:
    """A window of every ``size`` elements of a key (``count_window(size)``)."""

    def __init__(self, size: int, slide: int | None = None) -> None:
        for what, n in (("window size", size), ("window slide", slide if slide is not None else 1)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise JobDefinitionError(f"count windows: the {what} must be a positive int, not {n!r}")
        self.size, self.slide = size, slide

    @staticmethod
    def of(window_size: int) -> CountTumblingWindowAssigner:
        return CountTumblingWindowAssigner(window_size)


class CountSlidingWindowAssigner(CountTumblingWindowAssigner):
    """Every ``slide`` elements of a key, a window of its last ``size`` (``count_window(size, slide)``)."""

    @staticmethod
    def of(window_size: int, window_slide: int) -> CountSlidingWindowAssigner:  # type: ignore[override]
        return CountSlidingWindowAssigner(window_size, window_slide)


class CountWindow:
    """What ``context.window()`` is for a count window: its number per key (``id``)."""

    def __init__(self, id: int) -> None:  # noqa: A002 - PyFlink's name
        self.id = id

    def max_timestamp(self) -> int:
        return 2**63 - 1


class TimeWindow:
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def max_timestamp(self) -> int:
        return self.end - 1


def yarnflow_assigner(assigner: Any) -> Any:
    if not isinstance(assigner, _Assigner):
        raise JobDefinitionError(f"window: expected one of pyflink.datastream.window's assigners "
                                 f"(TumblingEventTimeWindows.of(Time.seconds(5)), ...), not {assigner!r}")
    return assigner._yarnflow()


class Trigger:
    """When a window fires. Only each window kind's own default is run (yarnflow's window
    operator fires a time window at its end, and again for late elements within the allowed
    lateness): ``EventTimeTrigger`` on event-time windows, ``ProcessingTimeTrigger`` on
    processing-time ones; any other trigger is refused by name."""

    event_time: bool | None = None


class EventTimeTrigger(Trigger):
    event_time = True

    @staticmethod
    def create() -> EventTimeTrigger:
        return EventTimeTrigger()


class ProcessingTimeTrigger(Trigger):
    event_time = False

    @staticmethod
    def create() -> ProcessingTimeTrigger:
        return ProcessingTimeTrigger()


class CountTrigger(Trigger):
    @staticmethod
    def of(window_size: int) -> CountTrigger:
        return CountTrigger()


class PurgingTrigger(Trigger):
    @staticmethod
    def of(nested_trigger: Any) -> PurgingTrigger:
        return PurgingTrigger()
