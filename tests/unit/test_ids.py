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


def test_a_result_partition_id_is_formatted_and_parsed_back() -> None:
    pid = ids.ResultPartitionID.of(JobID("job1"), ids.ExecutionAttemptID("att9"), 2)
    assert pid == "job1.att9.2" and type(pid) is ids.ResultPartitionID
    assert (pid.job_id, pid.producer_attempt_id, pid.edge_index) == ("job1", "att9", 2)
    assert type(pid.job_id) is JobID and type(pid.producer_attempt_id) is ids.ExecutionAttemptID
    again = ids.ResultPartitionID(str(pid))  # as read from the wire
    assert again.producer_attempt_id == "att9"


@pytest.mark.parametrize("bad", ["nodots", "j.a", "j.a.x", ".a.1", "j..1"])
def test_a_malformed_result_partition_id_names_itself_when_parsed(bad: str) -> None:
    with pytest.raises(ValueError, match="producer attempt id"):
        _ = ids.ResultPartitionID(bad).producer_attempt_id


@pytest.mark.parametrize("part", ["", "a.b", "a/b"])
def test_a_result_partition_id_is_not_built_from_parts_that_would_not_parse(part: str) -> None:
    with pytest.raises(ValueError):
        ids.ResultPartitionID.of(part or "", "att", 0)
