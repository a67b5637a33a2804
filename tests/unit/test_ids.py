"""Typed ids: their own types, fresh ones unique, empty ones rejected."""

from __future__ import annotations

import pytest

from yarnflow.common import ids
from yarnflow.common.ids import AllocationID, JobID, JobVertexID, ResourceID

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

ALL_IDS = [ids.JobID, ids.JobVertexID, ids.ExecutionAttemptID, ids.AllocationID, ids.ResourceID,
           ids.ResultPartitionID, ids.LeaderSessionID]


@pytest.mark.parametrize("cls", ALL_IDS, ids=lambda c: c.__name__)
def test_ids_are_typed_strings(cls: type) -> None:
    value = cls("abc123")
    assert type(value) is cls
    assert isinstance(value, str)
    assert value == "abc123" and str(value) == "abc123"
    assert repr(value) == f"{cls.__name__}('abc123')"
    assert hash(value) == hash("abc123")  # usable as dict keys next to their wire strings
    assert type(cls(value)) is cls


@pytest.mark.parametrize("cls", ALL_IDS, ids=lambda c: c.__name__)
def test_generate_gives_fresh_ids_of_the_type(cls: type) -> None:
    many = {cls.generate() for _ in range(1000)}
    assert len(many) == 1000
    one = next(iter(many))
    assert type(one) is cls
    assert one.startswith(cls.prefix)


def test_resource_ids_carry_a_prefix() -> None:
    rid = ResourceID.generate()
    assert rid.startswith("te-") and len(rid) == len("te-") + 16
    assert len(JobID.generate()) == 32


@pytest.mark.parametrize("cls", ALL_IDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", ["", None, 5, b"abc"], ids=["empty", "none", "int", "bytes"])
def test_bad_ids_are_rejected(cls: type, bad: object) -> None:
    with pytest.raises(ValueError) as info:
        cls(bad)
    assert cls.__name__ in str(info.value)


def test_ids_of_different_types_keep_their_type() -> None:
    job, alloc = JobID("x"), AllocationID("x")
    assert type(job) is not type(alloc)
    assert type(JobVertexID(job)) is JobVertexID
