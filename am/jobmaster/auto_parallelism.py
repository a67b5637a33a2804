"""The adaptive batch scheduler's part of a JobMaster (Flink's AdaptiveBatchScheduler with its
DefaultVertexParallelismAndInputInfosDecider): the parallelism of a vertex compiled with
``dynamic_parallelism`` is decided when every producer it reads from has finished, from the
bytes they wrote for it.

    parallelism = ceil(input bytes / (avg-data-volume-per-task - broadcast bytes)),
                  between min-parallelism and the vertex's upper bound

Broadcast inputs (every subtask reads all of them) count at most half a task's volume, as in
Flink. The subtasks past the decided parallelism never run: their pipelined regions are booked
as finished at once (their blocking inputs are read by the others) and stay out of failover.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from yarnflow.am.jobmaster.execution_graph import ExecutionGraph, ExecutionVertex
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import JobVertexID
from yarnflow.common.states import Partitioner

log = logging.getLogger(__name__)

#: the most of a task's volume broadcast inputs may count for (Flink's CAP_RATIO_OF_BROADCAST)
BROADCAST_CAP = 0.5


@dataclass(frozen=True)
class Decision:
    vertex: str
    parallelism: int
    bound: int
    input_bytes: int
    broadcast_bytes: int

    def describe(self) -> str:
        return (f"{self.vertex}: parallelism {self.parallelism} of at most {self.bound}, for "
                f"{_mib(self.input_bytes)} of input" +
                (f" and {_mib(self.broadcast_bytes)} broadcast" if self.broadcast_bytes else ""))


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def decide_parallelism(input_bytes: int, broadcast_bytes: int, avg_bytes_per_task: int, least: int,
                       bound: int) -> int:
    """The parallelism for ``input_bytes`` (plus ``broadcast_bytes`` every subtask reads), each
    subtask getting about ``avg_bytes_per_task``, between ``least`` and ``bound``."""
    broadcast = min(broadcast_bytes, int(avg_bytes_per_task * BROADCAST_CAP))
    per_task = max(1, avg_bytes_per_task - broadcast)
    wanted = math.ceil(input_bytes / per_task) if input_bytes > 0 else 1
    return max(min(least, bound), min(wanted, bound))


class AutoParallelism:
    """Decides the vertices of one job (a JobMaster's; pure bookkeeping, no I/O)."""

    def __init__(self, graph: ExecutionGraph, config: Configuration) -> None:
        self._graph = graph
        self._least = int(config[Options.AUTO_MIN_PARALLELISM])
        self._avg = int(config[Options.AUTO_AVG_BYTES])
        self.undecided = {str(vid) for vid, ejv in graph.vertices.items() if not ejv.decided}
        #: subtasks past their vertex's decided parallelism: they never run
        self.retired: set[SubtaskId] = set()
        self.decisions: list[Decision] = []

    def _input_bytes(self, vertex_id: str) -> tuple[int, int]:
        """(bytes of the all-to-all inputs, bytes of the broadcast ones) the producers wrote for
        ``vertex_id``: each producer's figure for that output, as its final report gave it."""
        total = broadcast = 0
        for idx, edge in self._graph.in_edges(vertex_id):
            source = str(edge.source_vertex_id)
            position = [i for i, _ in self._graph.out_edges(source)].index(idx)
            for ev in self._graph.vertices[edge.source_vertex_id].active:
                m = ev.current.metrics
                if m is None:
                    continue
                n = m.result_bytes[position] if position < len(m.result_bytes) else m.bytes_out
                if edge.partitioner == Partitioner.BROADCAST:
                    broadcast += n
                else:
                    total += n
        return total, broadcast

    def decide(self, region: PipelinedRegion) -> list[ExecutionVertex]:
        """Decide the undecided vertices ``region`` (whose inputs are complete) has; returns the
        subtasks that will not run."""
        surplus: list[ExecutionVertex] = []
        for vertex_id in sorted({s.vertex_id for s in region.subtasks} & self.undecided):
            self.undecided.discard(vertex_id)
            ejv = self._graph.vertices[JobVertexID(vertex_id)]
            bound = len(ejv.subtasks)
            total, broadcast = self._input_bytes(vertex_id)
            p = decide_parallelism(total, broadcast, self._avg, self._least, bound)
            decision = Decision(ejv.job_vertex.name, p, bound, total, broadcast)
            self.decisions.append(decision)
            log.info("adaptive batch: %s", decision.describe())
            left_out = self._graph.decide(vertex_id, p)
            self.retired |= {SubtaskId(vertex_id, ev.subtask_index) for ev in left_out}
            surplus += left_out
        return surplus

    def describe(self) -> str:
        """The decisions so far, for the job's status."""
        if not self.decisions and not self.undecided:
            return ""
        parts = [d.describe() for d in self.decisions]
        if self.undecided:
            names = sorted(ejv.job_vertex.name for vid, ejv in self._graph.vertices.items()
                           if str(vid) in self.undecided)
            parts.append("waiting for their inputs: " + ", ".join(names))
        return "adaptive batch: " + "; ".join(parts)
