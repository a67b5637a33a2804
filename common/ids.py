"""Typed ids. Ids are types of their own, never bare strings passed around; on the wire they
are strings (``str(id)``), parsed back with ``Type(value)``."""

from __future__ import annotations

import uuid
from typing import TypeVar

_T = TypeVar("_T", bound="_Id")


class _Id(str):
    """A string with a type: ``JobID("ab12")``. ``generate()`` makes a fresh random one."""

    __slots__ = ()
    prefix = ""

    def __new__(cls, value: str) -> _Id:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{cls.__name__} must be a non-empty string, got {value!r}")
        return super().__new__(cls, value)

    @classmethod
    def generate(cls: type[_T]) -> _T:
        return cls(cls.prefix + uuid.uuid4().hex[: 16 if cls.prefix else 32])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"


class JobID(_Id):
    __slots__ = ()

    @classmethod
    def fixed(cls, seed: str, index: int) -> JobID:
        """The ``index``-th job id of ``seed`` (an application id): the same in every run of an
        application-mode ``main()``, as Flink fixes an application's job ids, so that a rerun
        after an AppMaster failure finds the job it submitted before (recovered, or its
        retained checkpoints)."""
        return cls(uuid.uuid5(uuid.NAMESPACE_URL, f"yarnflow-job/{seed}/{index}").hex)


class JobVertexID(_Id):
    __slots__ = ()


class ExecutionAttemptID(_Id):
    __slots__ = ()


class AllocationID(_Id):
    __slots__ = ()


class ResourceID(_Id):
    """Identifies a TaskExecutor (a process / YARN container)."""

    __slots__ = ()
    prefix = "te-"


class ResultPartitionID(_Id):
    """One produced result partition: ``<job id>.<producer attempt id>.<edge index>``.

    ``of()`` formats one; ``job_id``, ``producer_attempt_id`` and ``edge_index`` parse it back
    (ValueError for an id not in this form)."""

    __slots__ = ()

    @classmethod
    def of(cls, job_id: str, producer_attempt_id: str, edge_index: int) -> ResultPartitionID:
        for part in (job_id, producer_attempt_id):
            if not part or "." in part or "/" in part:
                raise ValueError(f"cannot build a ResultPartitionID from {part!r}: empty or holds '.' or '/'")
        return cls(f"{job_id}.{producer_attempt_id}.{int(edge_index)}")

    def _parts(self) -> tuple[str, str, int]:
        job, sep1, rest = self.partition(".")
        attempt, sep2, index = rest.partition(".")
        if not (job and sep1 and attempt and sep2 and index.isdigit()):
            raise ValueError(f"{self!r} is not <job id>.<producer attempt id>.<edge index>")
        return job, attempt, int(index)

    @property
    def job_id(self) -> JobID:
        return JobID(self._parts()[0])

    @property
    def producer_attempt_id(self) -> ExecutionAttemptID:
        return ExecutionAttemptID(self._parts()[1])

    @property
    def edge_index(self) -> int:
        return self._parts()[2]


class LeaderSessionID(_Id):
    """The fencing token of a leader component."""

    __slots__ = ()
