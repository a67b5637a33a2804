"""Dynamic split assignment (Flink's SplitEnumerator): the JobMaster enumerates a source's
splits once, from the source operator stored in the job artifact, and hands them out one at
a time to whichever source subtask asks, so fast subtasks take more work.

Every split handed out is booked under the execution attempt that took it. When that attempt
is replaced by a new one (it failed, was cancelled by a failover, or it finished but its
blocking output was lost with its TaskExecutor), the JobMaster calls ``return_splits`` and its
splits go back to the front of the pending queue (Flink's ``addSplitsBack``), so the restarted
sources read exactly the splits whose output was thrown away: each split is read by exactly
one attempt whose output survives.

A replaced attempt is retired: a split request it still sends (from a task not yet stopped)
is refused, so no split is handed to an attempt whose splits were already returned.

Checkpoints: ``snapshot(n)`` is the enumerator's part of checkpoint ``n`` (Flink's enumerator
checkpoint), written into its ``_metadata``: per source, the splits that are in no source
subtask's state of checkpoint ``n`` — those never handed out, and those taken after the
subtask emitted barrier ``n``. A JobMaster that starts the job again from checkpoint ``n`` (a
new leader) ``restore``s it, so together with the sources' restored state every split is read
exactly once.
"""

from __future__ import annotations

import base64
import collections
import logging
import pickle
from typing import TYPE_CHECKING, Any, Callable

from yarnflow.common.errors import NotFoundError
from yarnflow.common.messages import SourceSplit, SplitResponse

if TYPE_CHECKING:
    from yarnflow.common.artifacts import ArtifactCache

__all__ = ["SplitEnumerator"]

log = logging.getLogger(__name__)

Split = tuple[str, Any]  # (split id, payload handed to the source subtask)


class SplitEnumerator:
    """Part of the JobMaster's state: used on its main thread only (``request_split`` is an RPC
    of the JobMaster, run there like every other), so it needs no lock. A source's splits are
    enumerated once, at its first request (a listing of its files).

    ``load_source(vertex_id)`` returns the source operator of a vertex: an object with a
    ``name`` and ``enumerate_splits() -> list[(split id, payload)]``."""

    def __init__(self, load_source: Callable[[str], Any]) -> None:
        self._load_source = load_source
        self._pending: dict[str, collections.deque[Split]] = {}
        # attempt id -> (vertex id, [(split, last checkpoint barrier the attempt had emitted when it took it)])
        self._taken: dict[str, tuple[str, list[tuple[Split, int]]]] = {}
        self._retired: set[str] = set()
        self.assigned: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)  # every hand-out
        self.returned: dict[str, list[str]] = collections.defaultdict(list)  # every split given back

    @classmethod
    def from_artifact(cls, artifacts: ArtifactCache, artifact_uri: str, artifact_sha256: str) -> SplitEnumerator:
        """Sources loaded from the job artifact."""
        return cls(lambda vertex_id: artifacts.load_source(artifact_uri, artifact_sha256, vertex_id))

    def _splits(self, vertex_id: str) -> collections.deque[Split]:
        pending = self._pending.get(vertex_id)
        if pending is None:
            source = self._load_source(vertex_id)
            splits = source.enumerate_splits()
            log.info("source %s: %d splits", source.name, len(splits))
            pending = self._pending[vertex_id] = collections.deque(splits)
        return pending

    def request(self, vertex_id: str, subtask_index: int, attempt_id: object,
                last_checkpoint_id: int = 0) -> SplitResponse:
        """The next split for attempt ``attempt_id`` of subtask ``subtask_index``, or
        ``no_more_splits``. ``last_checkpoint_id`` is the last checkpoint barrier the subtask
        emitted: the split will be in the source state of every later checkpoint. Raises
        ``NotFoundError`` for an attempt already replaced (it must read nothing more)."""
        attempt = str(attempt_id)
        if attempt in self._retired:
            raise NotFoundError(f"execution attempt {attempt} was replaced: no more splits for it")
        pending = self._splits(vertex_id)
        if not pending:
            return SplitResponse(None, True)
        split = pending.popleft()
        self._taken.setdefault(attempt, (vertex_id, []))[1].append((split, last_checkpoint_id))
        self.assigned[vertex_id].append((subtask_index, split[0]))
        return SplitResponse(SourceSplit(split[0], pickle.dumps(split[1])), False)

    def return_splits(self, attempt_id: object, restored_checkpoint_id: int = 0,
                      new_attempt_id: object | None = None) -> int:
        """Attempt ``attempt_id`` is being replaced by a new attempt that restores checkpoint
        ``restored_checkpoint_id`` (0: none, it starts from nothing). The splits the old attempt
        took before emitting that checkpoint's barrier are in the restored source state (or
        were read to the end before it): they stay booked, now to ``new_attempt_id``. Every
        other split goes back to the front of its source's queue, in the order taken. The old
        attempt gets no further split. Idempotent. Returns how many splits went back."""
        attempt = str(attempt_id)
        self._retired.add(attempt)
        vertex_id, taken = self._taken.pop(attempt, ("", []))
        back = [split for split, seen in taken if not restored_checkpoint_id or seen >= restored_checkpoint_id]
        kept = [(split, seen) for split, seen in taken
                if restored_checkpoint_id and seen < restored_checkpoint_id]
        if kept and new_attempt_id is not None:
            self._taken.setdefault(str(new_attempt_id), (vertex_id, []))[1][:0] = kept
        if not back:
            return 0
        self._pending[vertex_id].extendleft(reversed(back))
        self.returned[vertex_id].extend(split_id for split_id, _ in back)
        log.info("%d splits of replaced attempt %s go back to the enumerator%s", len(back), attempt,
                 f" (restoring checkpoint {restored_checkpoint_id})" if restored_checkpoint_id else "")
        return len(back)

    def snapshot(self, checkpoint_id: int) -> dict[str, list[dict[str, str]]]:
        """The enumerator's state for checkpoint ``checkpoint_id`` (see the module docstring),
        JSON-ready: per source vertex, ``[{"split_id", "payload" (base64 pickle)}]`` in the order
        they would be handed out. Call once the checkpoint is complete, before any attempt
        of it is replaced."""
        state = {vertex: list(pending) for vertex, pending in self._pending.items()}
        for vertex, taken in self._taken.values():
            after = [split for split, seen in taken if seen >= checkpoint_id]
            if after:
                state.setdefault(vertex, [])[:0] = after
        return {vertex: [{"split_id": split_id, "payload": base64.b64encode(pickle.dumps(payload)).decode()}
                         for split_id, payload in splits] for vertex, splits in state.items()}

    def restore(self, state: dict[str, list[dict[str, str]]]) -> None:
        """Start from a checkpoint's enumerator state (from ``snapshot``): its sources hand out
        exactly those splits; sources it does not name enumerate theirs as usual. Call before
        the first request."""
        for vertex, splits in state.items():
            self._pending[vertex] = collections.deque(
                (s["split_id"], pickle.loads(base64.b64decode(s["payload"]))) for s in splits)
        log.info("split enumerator restored: %s", {v: len(s) for v, s in state.items()})

    def adopt(self, attempt_id: object, vertex_id: str, taken: list[tuple[str, int]]) -> int:
        """A source attempt that kept running across a change of leader, taken over by this
        JobMaster, holds ``taken``: (split id, last checkpoint barrier it had emitted when it took
        it). Those still pending here (the restored checkpoint's enumerator state has every split
        taken after its barrier) are taken out of the queue and booked under the attempt, as if
        handed out here, so each is read once, and given back if the attempt is replaced. (A
        split taken before the restored checkpoint is in its source state: never given back.)
        Returns how many were still pending."""
        if not taken:
            return 0
        pending = self._splits(vertex_id)
        seen = dict(taken)
        booked = [(split, seen[split[0]]) for split in pending if split[0] in seen]
        if booked:
            ids = {split[0] for split, _ in booked}
            self._pending[vertex_id] = collections.deque(split for split in pending if split[0] not in ids)
            self._taken.setdefault(str(attempt_id), (vertex_id, []))[1].extend(booked)
        log.info("source attempt %s taken over with %d splits (%d of them were pending in the restored state)",
                 attempt_id, len(taken), len(booked))
        return len(booked)

    def splits_of(self, attempt_id: object) -> list[str]:
        """The ids of the splits attempt ``attempt_id`` holds now."""
        return [split[0] for split, _ in self._taken.get(str(attempt_id), ("", []))[1]]
