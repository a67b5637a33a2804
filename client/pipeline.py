"""The user's pipeline as the compiler reads it (Flink's Transformation graph): a node per
operator, with the edges it reads from. ``datastream`` builds it; ``compiler`` and ``planner``
read and rewrite it, without depending on the API that built it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from yarnflow.common.states import Partitioner
from yarnflow.worker.operators.base import Operator, SourceOperator

_ids = itertools.count(1)


def next_id() -> int:
    """A number no other transformation or sink of this process has."""
    return next(_ids)


@dataclass(frozen=True)
class Input:
    """An edge of the user's pipeline: where a transformation reads from, and how."""

    upstream: Transformation
    partitioner: Partitioner = Partitioner.FORWARD
    keys: tuple[str, ...] = ()
    output_tag: str = ""   # read the upstream's side output of this tag
    input_index: int = 0   # 0, or 1 for the second input of a two-input operator
    #: ``forward()`` asked for: the two operators must have the same parallelism (otherwise a
    #: FORWARD input between different parallelisms is dealt round-robin)
    forward_only: bool = False


@dataclass(eq=False)
class Transformation:
    """One node of the user's pipeline: an operator (None for a union) and its inputs."""

    operator: Operator | None
    inputs: list[Input]
    parallelism: int | None = None
    max_parallelism: int | None = None
    slot_sharing_group: str = "default"
    chaining: bool = True
    event_time_column: str | None = None
    cpu_cores: float = 0.0
    memory_mb: int = 0
    #: its rows come out in an order (a sort): what follows it by a forward edge keeps that
    #: order, so it runs at parallelism 1 unless told otherwise
    ordered: bool = False
    id: int = field(default_factory=next_id)

    @property
    def is_source(self) -> bool:
        return isinstance(self.operator, SourceOperator)

    @property
    def is_union(self) -> bool:
        return self.operator is None
