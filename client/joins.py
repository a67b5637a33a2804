"""Joins of two streams: ``a.join(b)`` (``DataStream.join``) gives ``JoinedStreams``, which the
compiler turns into a batch join (broadcast, shuffled hash or sort-merge) or, with a window, a
window join."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.pipeline import Input, Transformation

if TYPE_CHECKING:
    from yarnflow.datastream import DataStream

__all__ = ["JoinedStreams"]


class JoinedStreams:
    """``a.join(b).where(*keys).equal_to(*keys)[.with_hint(h)][.window(assigner)].apply(join_fn=None)``.

    Without a window (BATCH jobs) the compiler picks how to join: a broadcast join when one input
    may be sent whole to every subtask (it is estimated at most
    ``table.optimizer.join.broadcast-threshold``, from its source files' sizes, and the join type
    does not need its unmatched rows), else a shuffled hash join that builds the smaller input
    (right when sizes are unknown). ``with_hint`` overrides: ``broadcast`` (the smaller input
    that may be broadcast), ``shuffle_hash``, ``sort_merge`` (both inputs sorted by key, in
    managed memory and spill files, then merged)."""

    HINTS = ("broadcast", "shuffle_hash", "sort_merge")

    def __init__(self, left: DataStream, right: DataStream, how: str = "inner") -> None:
        from yarnflow.worker.operators.batch.join_index import JOIN_TYPES

        if left.env is not right.env:
            raise JobDefinitionError("join of streams from different environments")
        if how not in JOIN_TYPES:
            raise JobDefinitionError(f"join type {how!r}: use inner, left_outer, right_outer, full_outer, "
                                     "left_semi (semi) or left_anti (anti)")
        self._how = how
        self._left, self._right = left, right
        self._lkeys: tuple[str, ...] = ()
        self._rkeys: tuple[str, ...] = ()
        self._assigner: Any = None
        self._hint: str | None = None

    def where(self, *keys: str) -> JoinedStreams:
        self._lkeys = keys
        return self

    def equal_to(self, *keys: str) -> JoinedStreams:
        self._rkeys = keys
        return self

    def with_hint(self, hint: str) -> JoinedStreams:
        """How to join two bounded streams: ``broadcast``, ``shuffle_hash`` or ``sort_merge``."""
        if hint not in self.HINTS:
            raise JobDefinitionError(f"join hint {hint!r}: use one of {', '.join(self.HINTS)}")
        self._hint = hint
        return self

    def window(self, assigner: Any) -> JoinedStreams:
        self._assigner = assigner
        return self

    def apply(self, join_fn: Callable[[Any, Any], dict[str, Any]] | None = None,
              name: str = "window join") -> DataStream:
        """The joined stream. ``join_fn(left_row, right_row)`` (row dicts; None for the side an
        outer join has no match on) makes each output row instead of the joined columns."""
        from yarnflow.worker.operators.windows import WindowJoinOperator

        if not self._lkeys or len(self._lkeys) != len(self._rkeys):
            raise JobDefinitionError("join needs where(...) and equal_to(...) with the same number of keys")
        if self._assigner is None:
            from yarnflow.worker.operators.batch.hash_join import HashJoin

            try:
                join = HashJoin(list(self._lkeys), list(self._rkeys), self._how, join_fn=join_fn,
                                name="join" if name == "window join" else name)
            except ValueError as exc:
                raise JobDefinitionError(str(exc)) from None
            join.hint = self._hint  # type: ignore[attr-defined]
            t = Transformation(join, [
                Input(self._left.transformation, Partitioner.HASH, self._lkeys, self._left._tag, 0),
                Input(self._right.transformation, Partitioner.HASH, self._rkeys, self._right._tag, 1)])
            return self._left._stream(t)
        if self._how != "inner":
            raise JobDefinitionError("a window join is an inner join: leave out how=...")
        if self._hint is not None:
            raise JobDefinitionError("a window join takes no hint: with_hint is for joins of bounded streams")
        lt, rt = self._left.transformation.event_time_column, self._right.transformation.event_time_column
        if not lt or not rt:
            raise JobDefinitionError("a window join needs event time on both inputs: "
                                     "assign_timestamps_and_watermarks(...) on each")
        op = WindowJoinOperator(list(self._lkeys), list(self._rkeys), self._assigner, lt, rt, join_fn=join_fn,
                                name=name)
        t = Transformation(op, [Input(self._left.transformation, Partitioner.HASH, self._lkeys, self._left._tag, 0),
                                Input(self._right.transformation, Partitioner.HASH, self._rkeys, self._right._tag, 1)],
                           event_time_column=lt)
        return self._left._stream(t)
