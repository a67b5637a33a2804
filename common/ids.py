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
    __slots__ = ()


class LeaderSessionID(_Id):
    """The fencing token of a leader component."""

    __slots__ = ()
