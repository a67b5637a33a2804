"""ResourceDriver: how the ResourceManager gets and gives back TaskExecutor processes."""

from __future__ import annotations

from typing import Callable, Protocol

from yarnflow.common.ids import ResourceID

# (resource id, human-readable reason) when a worker process ends on its own
WorkerTerminated = Callable[[ResourceID, str], None]


class ResourceDriver(Protocol):
    def start(self, rm_address: str, on_terminated: WorkerTerminated) -> None: ...

    def start_worker(self) -> ResourceID:
        """Launch one TaskExecutor; it registers with the ResourceManager by itself."""
        ...

    def stop_worker(self, resource_id: ResourceID) -> None: ...

    def stop(self) -> None:
        """Stop every worker this driver started."""
        ...

    def worker_pids(self) -> dict[ResourceID, int]: ...
