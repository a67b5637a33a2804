"""PyFlink's windowed streams over yarnflow's (``key_by(...).window(...)``, ``window_all``):
reduce, aggregate, process and apply, late data, the window's default trigger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.wrappers import (OutputTag, _Aggregate, _Collect, _name, _Reduce, _WindowCall,
                                                  _window_method)

if TYPE_CHECKING:
    from yarnflow.pyflink.datastream.data_stream import DataStream, KeyedStream

__all__ = ["WindowedStream", "AllWindowedStream"]

class WindowedStream:
    """``key_by(...).window(assigner)`` of PyFlink: ``reduce`` and ``aggregate`` (each with an
    optional window function), ``process`` (ProcessWindowFunction), ``apply`` (WindowFunction),
    lateness."""

    def __init__(self, keyed: KeyedStream, windowed: Any, keyed_functions: bool = True) -> None:
        self._keyed = keyed
        self._w = windowed
        self._keyed_functions = keyed_functions

    def allowed_lateness(self, time_ms: Any) -> WindowedStream:
        self._w.allowed_lateness(int(getattr(time_ms, "to_milliseconds", lambda: time_ms)()))
        return self

    def _then(self, ds: Any, fn: Any, method: str, output_type: TypeInformation | None, collected: bool
              ) -> DataStream:
        call = _WindowCall(fn, method, output_type, collected, self._keyed_functions)
        out = self._keyed._derive(ds.flat_map(call, name=_name(fn, "Window Function")), output_type)
        out._sides_of = ds  # (late data is the window's side output)
        return out

    def side_output_late_data(self, output_tag: OutputTag) -> WindowedStream:
        """Elements too late for their window go to ``output_tag`` (get_side_output of the result)."""
        self._w.side_output_late_data(output_tag.tag_id)
        return self

    def trigger(self, trigger: Any) -> WindowedStream:
        """Only the window's own default trigger (EventTimeTrigger / ProcessingTimeTrigger)."""
        default = getattr(trigger, "event_time", None)
        if default is not None and default == bool(getattr(self._w._assigner, "is_event_time", False)):
            return self
        raise JobDefinitionError(f"window trigger {type(trigger).__name__} is not supported yet by yarnflow's PyFlink "
                                 "layer: windows fire at their end (EventTimeTrigger / ProcessingTimeTrigger, the "
                                 "defaults), and again for late data within the allowed lateness")

    def evictor(self, evictor: Any) -> WindowedStream:
        raise JobDefinitionError("window evictors are not supported yet by yarnflow's PyFlink layer")

    def reduce(self, reduce_function: Any, window_function: Any = None,
               output_type: TypeInformation | None = None) -> DataStream:
        fn = _Reduce(reduce_function, "reduce", self._keyed._type)
        reduced = self._w.reduce(fn, name=_name(reduce_function, "Window Reduce"))
        if window_function is not None:
            return self._then(reduced, window_function, _window_method(window_function), output_type, False)
        return self._keyed._derive(reduced, self._keyed._type)

    def aggregate(self, aggregate_function: Any, window_function: Any = None,
                  accumulator_type: TypeInformation | None = None,
                  output_type: TypeInformation | None = None) -> DataStream:
        if window_function is not None:
            out = self._w.aggregate(_Aggregate(aggregate_function, None),
                                    name=_name(aggregate_function, "Window Aggregate"))
            return self._then(out, window_function, _window_method(window_function), output_type, False)
        out = self._w.aggregate(_Aggregate(aggregate_function, output_type),
                                name=_name(aggregate_function, "Window Aggregate"))
        return self._keyed._derive(out, output_type)

    def process(self, process_window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        """``process(key, context, elements)`` once a window fires (``context.window()``)."""
        collected = self._w.aggregate(_Collect(), name="Window Elements")
        return self._then(collected, process_window_function, "process", output_type, True)

    def apply(self, window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        """``apply(key, window, inputs)`` once a window fires."""
        collected = self._w.aggregate(_Collect(), name="Window Elements")
        return self._then(collected, window_function, "apply", output_type, True)


class AllWindowedStream(WindowedStream):
    """``window_all(assigner)``: one window operator (parallelism 1, as in Flink) over every
    element; its functions take no key."""
