"""Unaligned checkpoints in a task (Flink's FLIP-76): the bookkeeping of the in-flight data.

Once a task has taken its snapshot at the first barrier (``BarrierAligner`` in unaligned
mode), each input channel whose barrier has not come yet is *recording*: what the task takes
from it until the barrier comes, plus what that barrier overtook in the channel's queue, is
the channel's in-flight input (``Inflight.inputs``); what the task's own barrier overtook in
its output subpartitions is its in-flight output. When every channel delivered its barrier
(or ended) the snapshot goes to the ``SnapshotSink`` with that data (``@in-``/``@out-``).

A channel whose producer has finished never delivers a barrier: its end of partition stands
for it, and since what it still holds is bounded, the task takes it ahead (``_pull_ahead``)
instead of recording it at the pace it processes it.

A mixin of ``StreamTask``, not a component: it reads and changes the task's own loop state
(the elements taken but not processed, ``_replay``) on the task thread; it is kept in its own
file only to keep each file readable. What it uses of the task is declared below.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Protocol

import pyarrow as pa

from yarnflow.worker.runtime.barriers import AlignerAction, BarrierAligner, InflightComplete
from yarnflow.worker.runtime.checkpoints import release_all
from yarnflow.worker.elements import CheckpointBarrier, EndOfPartition, Watermark, WatermarkStatus
from yarnflow.worker.network.gate import ChannelError, InputGate
from yarnflow.worker.state.tables import Snapshot as StateSnapshot

log = logging.getLogger(__name__)


class SnapshotSink(Protocol):
    """Takes a task's snapshots (``SnapshotWriter``: writes them and acknowledges)."""

    def submit(self, checkpoint_id: int, snapshots: list[StateSnapshot], alignment_ms: int,
               sync_ms: int, channel_state: dict[str, list[Any]] | None = None, start_delay_ms: int = 0) -> None: ...

    def decline(self, checkpoint_id: int, reason: str) -> None: ...


class Inflight:
    """An unaligned checkpoint whose snapshot is taken and whose in-flight input is still
    being recorded: per input channel, what was ahead of its barrier and not processed at the
    snapshot; per output subpartition, what the barrier overtook."""

    def __init__(self, barrier: CheckpointBarrier, snapshots: list[StateSnapshot], alignment_ms: int,
                 sync_ms: int, outputs: dict[tuple[int, int], list[Any]], start_delay_ms: int = 0) -> None:
        self.barrier = barrier
        self.snapshots = snapshots
        self.alignment_ms = alignment_ms
        self.sync_ms = sync_ms
        self.start_delay_ms = start_delay_ms
        self.outputs = outputs
        self.inputs: dict[int, list[Any]] = {}

    def channel_state(self, channel_inputs: list[int]) -> dict[str, list[Any]]:
        """The in-flight data by file name: ``@in-<input>-<channel>`` (the vertex input the
        channel belongs to, for a restore at another parallelism) and ``@out-<writer>-<i>``."""
        state = {f"@in-{channel_inputs[ch]}-{ch}": elements for ch, elements in sorted(self.inputs.items()) if elements}
        state.update({f"@out-{w}-{i}": elements for (w, i), elements in sorted(self.outputs.items()) if elements})
        return state


class UnalignedCheckpoints:
    name: str
    gate: InputGate | None
    channel_inputs: list[int]
    _aligner: BarrierAligner | None
    _snapshots: SnapshotSink | None
    #: the pending unaligned checkpoint whose in-flight data is being recorded
    _inflight: Inflight | None
    _failed_unaligned: bool
    #: elements taken from the channels and not processed yet, in order
    _replay: collections.deque[tuple[int, Any]]
    _pulling: bool
    _pulled_end: set[int]

    def _apply(self, actions: list[AlignerAction], channel: int | None = None) -> None:
        raise NotImplementedError  # StreamTask's

    def _overtake_all(self, first: int | None) -> None:
        """The unaligned snapshot is taken: the barrier on ``first`` (if it came on a channel)
        overtook what that channel held; the other channels' barriers are pulled ahead of what
        they queued if they are there, or overtake when they come."""
        inflight, aligner, gate = self._inflight, self._aligner, self.gate
        assert inflight is not None and aligner is not None and gate is not None
        checkpoint_id = inflight.barrier.checkpoint_id
        if first is not None:
            inflight.inputs[first] = self._ahead_of_barrier(first, gate.overtaken_by(first, checkpoint_id))
        for ch in range(len(self.channel_inputs)):
            if self._inflight is None or not aligner.is_recording(ch):
                continue
            ahead = gate.overtake(ch, checkpoint_id)
            if ahead is not None:
                self._barrier_came(ch, ahead)
                self._apply(aligner.on_overtaken(ch))

    def _ahead_of_barrier(self, channel: int, overtaken: list[Any]) -> list[Any]:
        """A channel's in-flight input when its barrier comes: what it recorded, what the task
        took from it but has not processed yet (``_replay``), then what the barrier overtook."""
        inflight = self._inflight
        assert inflight is not None
        data = (pa.RecordBatch, Watermark, WatermarkStatus)
        return (inflight.inputs.get(channel, []) + [e for ch, e in self._replay if ch == channel and isinstance(e, data)]
                + [e for e in overtaken if isinstance(e, data)])

    def _barrier_came(self, channel: int, overtaken: list[Any]) -> None:
        if self._inflight is not None:
            self._inflight.inputs[channel] = self._ahead_of_barrier(channel, overtaken)

    def _pull_ahead(self, direct: bool) -> None:
        """An unaligned checkpoint records a channel whose producer has finished (all of them
        when it was triggered directly, ``direct``): no barrier comes on it, its end of
        partition stands for one, and what it still holds is bounded (the producer's queue and
        the channel's credit). It is taken now, as fast as it arrives, instead of at the pace
        the task processes it: the checkpoint completes in the time the rest of that input
        takes to arrive, and the task processes what was taken afterwards, in order
        (``_replay``)."""
        gate, aligner, inflight = self.gate, self._aligner, self._inflight
        assert gate is not None and aligner is not None and inflight is not None
        pulling = frozenset(ch for ch in range(len(self.channel_inputs))
                            if aligner.is_recording(ch) and (direct or gate.producer_finished(ch)))
        self._pulling = False
        for ch in sorted(pulling & self._pulled_end):
            # its end was taken for an earlier checkpoint: the rest waits in ``_replay`` already
            pulling -= {ch}
            self._barrier_came(ch, [])
            self._apply(aligner.on_overtaken(ch))
        for ch in pulling:
            gate.take_rest(ch)
        while pulling and self._inflight is inflight:
            polled = gate.poll(0, pulling)
            if polled is None:
                self._pulling = True  # more to come: pulled again between the slices of a batch
                return
            ch, element = polled
            if ch in pulling and isinstance(element, (EndOfPartition, CheckpointBarrier, ChannelError)):
                pulling -= {ch}
                pending = aligner.pending
                if not isinstance(element, ChannelError) and pending is not None and (
                        isinstance(element, EndOfPartition) or element.checkpoint_id == pending.checkpoint_id):
                    # the channel's in-flight data is complete: what it delivered up to here
                    self._barrier_came(ch, [])
                    self._replay.append(polled)
                    if isinstance(element, EndOfPartition):
                        self._pulled_end.add(ch)
                    self._apply(aligner.on_overtaken(ch))
                    continue
            self._replay.append(polled)

    def _record(self, channel: int, element: Any) -> None:
        """Keep ``element`` of ``channel`` as in-flight input of the pending unaligned checkpoint
        when its barrier has not come on that channel yet."""
        if self._inflight is not None and self._aligner is not None and self._aligner.is_recording(channel):
            self._inflight.inputs.setdefault(channel, []).append(element)

    def _complete_unaligned(self, action: InflightComplete) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None or inflight.barrier.checkpoint_id != action.checkpoint_id:
            return
        if action.alignment_ms > 1000:  # what kept it: the channels whose barrier (or end) came late
            log.info("%s: the in-flight data of unaligned checkpoint %d took %d ms to complete (elements per "
                     "channel: %s)", self.name, action.checkpoint_id, action.alignment_ms,
                     {ch: len(v) for ch, v in sorted(inflight.inputs.items())})
        if self._failed_unaligned or self._snapshots is None:
            release_all(inflight.snapshots)
            return
        self._snapshots.submit(inflight.barrier.checkpoint_id, inflight.snapshots,
                               inflight.alignment_ms + action.alignment_ms, inflight.sync_ms,
                               channel_state=inflight.channel_state(self.channel_inputs),
                               start_delay_ms=inflight.start_delay_ms)
