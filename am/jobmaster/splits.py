"""Dynamic split assignment (Flink's SplitEnumerator): the JobMaster enumerates a source's
splits once, from the source operator stored in the job artifact, and hands them out one at
a time to whichever source subtask asks, so fast subtasks take more work."""

from __future__ import annotations

import collections
import logging
import pickle
import threading
from typing import Any

from yarnflow.common.messages import SourceSplit, SplitResponse
from yarnflow.worker.artifacts import ArtifactCache

log = logging.getLogger(__name__)


class SplitEnumerator:
    """Thread-safe: enumeration may touch a remote filesystem, so it runs on the caller's
    (RPC handler) thread, not on the JobMaster's main thread."""

    def __init__(self, artifacts: ArtifactCache, artifact_uri: str, artifact_sha256: str) -> None:
        self._artifacts = artifacts
        self._uri = artifact_uri
        self._sha = artifact_sha256
        self._lock = threading.Lock()
        self._pending: dict[str, collections.deque[tuple[str, Any]]] = {}
        self.assigned: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)

    def _splits(self, vertex_id: str) -> collections.deque[tuple[str, Any]]:
        pending = self._pending.get(vertex_id)
        if pending is None:
            source = self._artifacts.load_source(self._uri, self._sha, vertex_id)
            splits = source.enumerate_splits()
            log.info("source %s: %d splits", source.name, len(splits))
            pending = self._pending[vertex_id] = collections.deque(splits)
        return pending

    def request(self, vertex_id: str, subtask_index: int) -> SplitResponse:
        with self._lock:
            pending = self._splits(vertex_id)
            if not pending:
                return SplitResponse(None, True)
            split_id, payload = pending.popleft()
            self.assigned[vertex_id].append((subtask_index, split_id))
        return SplitResponse(SourceSplit(split_id, pickle.dumps(payload)), False)
