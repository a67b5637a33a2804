"""Count windows of the PyFlink layer (``count_window(size[, slide])``,
``window(CountTumblingWindowAssigner.of(n))``), which yarnflow's window operator does not
have: a keyed process function keeps each key's elements in list state and fires the window
function every ``size`` elements (tumbling), or every ``slide`` over the last ``size``
(sliding, as Flink's count trigger and evictor), so they are checkpointed with the job."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from yarnflow.common.api import KeyedProcessFunction as OurKeyedProcess
from yarnflow.common.api import ListStateDescriptor, ValueStateDescriptor
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.records import decode, encoder
from yarnflow.pyflink.datastream.wrappers import _key_of, _name, _target, _WindowContext
from yarnflow.pyflink.datastream.window import CountWindow

if TYPE_CHECKING:
    from yarnflow.pyflink.datastream.data_stream import DataStream, KeyedStream

__all__ = ["CountWindowedStream"]


class _CountWindows(OurKeyedProcess):
    def __init__(self, size: int, slide: int | None, fire: Any, output_type: TypeInformation | None) -> None:
        self.size, self.slide, self.fire = size, slide, fire
        self.encode = encoder(output_type)

    def open(self, ctx: Any) -> None:
        self.elements = self.get_state(ListStateDescriptor("__count_window_elements"))
        self.counts = self.get_state(ValueStateDescriptor("__count_window_counts"))  # (since fired, windows fired)

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.elements.add(decode(row))
        since, fired = self.counts.value() or (0, 0)
        since += 1
        every = self.slide or self.size
        if since < every:
            self.counts.update((since, fired))
            return
        elements = self.elements.get()
        if self.slide is None:
            self.elements.clear()
        elif len(elements) > self.size:
            elements = elements[-self.size:]
            self.elements.update(elements)
        self.counts.update((0, fired + 1))
        for value in self.fire(_key_of(row), CountWindow(fired), elements) or ():
            out.collect(self.encode(value))


class CountWindowedStream:
    """``count_window(...)``: reduce, aggregate, process and apply, as the time windows'."""

    def __init__(self, keyed: KeyedStream, size: int, slide: int | None) -> None:
        self._keyed, self._size, self._slide = keyed, size, slide

    def _then(self, fire: Any, name: str, output_type: TypeInformation | None) -> DataStream:
        fn = _CountWindows(self._size, self._slide, fire, output_type)
        return self._keyed._derive(self._keyed._ds.process(fn, name=name), output_type)

    def reduce(self, reduce_function: Any, window_function: Any = None,
               output_type: TypeInformation | None = None) -> DataStream:
        reduce = _target(reduce_function, "reduce")
        after = _after(window_function)

        def fire(key: Any, window: Any, elements: list[Any]) -> Any:
            return after(key, window, [functools.reduce(reduce, elements)])
        return self._then(fire, _name(reduce_function, "Count Window Reduce"),
                          output_type if window_function is not None else self._keyed._type)

    def aggregate(self, aggregate_function: Any, window_function: Any = None,
                  accumulator_type: TypeInformation | None = None,
                  output_type: TypeInformation | None = None) -> DataStream:
        agg = aggregate_function
        after = _after(window_function)

        def fire(key: Any, window: Any, elements: list[Any]) -> Any:
            acc = agg.create_accumulator()
            for e in elements:
                acc = agg.add(e, acc)
            return after(key, window, [agg.get_result(acc)])
        return self._then(fire, _name(agg, "Count Window Aggregate"), output_type)

    def process(self, process_window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        fn = process_window_function
        return self._then(lambda key, window, elements: fn.process(key, _WindowContext(window), elements),
                          _name(fn, "Count Window Process"), output_type)

    def apply(self, window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        fn = window_function
        return self._then(lambda key, window, elements: fn.apply(key, window, elements),
                          _name(fn, "Count Window Apply"), output_type)


def _after(window_function: Any) -> Any:
    """What follows a pre-aggregation: the window function, or the result itself."""
    if window_function is None:
        return lambda key, window, results: results
    if callable(getattr(window_function, "process", None)):
        return lambda key, window, results: window_function.process(key, _WindowContext(window), results)
    return lambda key, window, results: window_function.apply(key, window, results)


