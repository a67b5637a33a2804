"""Operator state of a user function that is a ``CheckpointedFunction`` (Flink's), for the
one-input operators that run user functions (map_batches, map, filter, flat_map, process):
``initialize_state(ctx)`` before the function's ``open``, ``snapshot_state(ctx)`` at each
checkpoint, its list and union-list states in an ``OperatorStateStore`` whose tables go into the
operator's snapshot (``worker/state/operator_state.py`` says how they are restored and rescaled).

Such a function keeps state in the task's process, so its operator never sends batches to a
Python worker process (its copy of the function there would not have the state)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from yarnflow.common.api.co_functions import CheckpointedFunction
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.state.operator_state import OperatorStateStore

__all__ = ["FunctionState", "InitContext"]


class InitContext:
    """What ``CheckpointedFunction.initialize_state`` / ``snapshot_state`` are given."""

    def __init__(self, store: OperatorStateStore, checkpoint_id: int = 0) -> None:
        self._store = store
        self.checkpoint_id = checkpoint_id

    def is_restored(self) -> bool:
        return self._store.is_restored

    def get_operator_state_store(self) -> OperatorStateStore:
        return self._store


class FunctionState:
    """The operator state of ``op``'s user function ``fn`` (nothing when it is not a
    CheckpointedFunction)."""

    def __init__(self, op: Operator, fn: Any) -> None:
        self.op, self.fn = op, fn if isinstance(fn, CheckpointedFunction) else None
        self.store = OperatorStateStore(op.ctx.subtask_index, op.ctx.parallelism, op.name)

    def restore(self, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Keep the operator state tables; returns the operator's own."""
        return self.store.restore(tables)

    def initialize(self) -> None:
        """Before the function's ``open``."""
        if self.fn is not None:
            self.op.call_user(self.fn.initialize_state, InitContext(self.store))

    def snapshot(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if self.fn is None:
            return {}
        self.op.call_user(self.fn.snapshot_state, InitContext(self.store, checkpoint_id))
        return self.store.snapshot()
