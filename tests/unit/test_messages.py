"""Messages mirror the Thrift IDL one to one and survive the wire: for every message, a fully
populated instance goes through ``to_thrift`` / ``from_thrift`` and through real Thrift binary
bytes (the accelerated protocol the RPC layer uses)."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import types
import typing
from typing import Any

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocolAcceleratedFactory, TBinaryProtocolFactory
from thrift.Thrift import TType
from thrift.TSerialization import deserialize, serialize

from yarnflow.common import ids, messages, states
from yarnflow.common.errors import InvalidRequestError
from yarnflow.common.messages import (
    ALL_MESSAGES,
    ErrorInfo,
    JobEdge,
    JobGraph,
    JobVertex,
    Message,
    ResourceProfile,
    SlotReport,
    SlotStatus,
    TaskDeploymentDescriptor,
)
from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

FACTORIES = {"accelerated": TBinaryProtocolAcceleratedFactory(), "pure-python": TBinaryProtocolFactory()}


# ---- a builder of fully populated messages ------------------------------------------------

class _Builder:
    """Builds an instance of a message with a non-default value in every field, driven by the
    dataclass annotations and the Thrift spec (so an i64 field gets a value beyond 32 bits)."""

    def __init__(self, set_optionals: bool = True) -> None:
        self._n = itertools.count(1)
        self.set_optionals = set_optionals

    def message(self, cls: type[Message]) -> Message:
        hints = typing.get_type_hints(cls)
        spec = {s[2]: s for s in cls._thrift.thrift_spec if s is not None}
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            kwargs[f.name] = self.value(hints[f.name], spec[f.name][1], f"{cls.__name__}.{f.name}")
        return cls(**kwargs)

    def value(self, tp: Any, ttype: int, label: str) -> Any:
        origin = typing.get_origin(tp)
        if origin is typing.Union or origin is types.UnionType:
            if not self.set_optionals:
                return None
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            return self.value(inner, ttype, label)
        if origin is list:
            (arg,) = typing.get_args(tp)
            return [self.value(arg, TType.STRUCT, f"{label}[{i}]") for i in range(2)]
        if origin is dict:
            kt, vt = typing.get_args(tp)
            if isinstance(kt, type) and issubclass(kt, enum.Enum):
                keys = list(kt)[-2:]  # non-zero members
            else:
                keys = [self.value(kt, TType.STRING, f"{label}.k{i}") for i in range(2)]
            return {k: self.value(vt, TType.I32, f"{label}.v") for k in keys}
        if isinstance(tp, type):
            if issubclass(tp, Message):
                return self.message(tp)
            if issubclass(tp, enum.Enum):
                return list(tp)[-1]
            if issubclass(tp, ids._Id):
                return tp(f"{tp.__name__}-{next(self._n)}")
            if tp is bool:
                return True
            if tp is int:
                n = next(self._n)
                return (1 << 40) + n if ttype == TType.I64 else 1000 + n
            if tp is float:
                return 0.5 + next(self._n)
            if tp is str:
                return f"{label} #{next(self._n)} – ünïcode ✓"
            if tp is bytes:
                return bytes(range(256)) + f"{label}{next(self._n)}".encode()
        raise AssertionError(f"the test builder does not know {tp!r} ({label})")


def _populated(cls: type[Message], set_optionals: bool = True) -> Message:
    return _Builder(set_optionals).message(cls)


def _wire(obj: Any, factory: Any) -> Any:
    data = serialize(obj, protocol_factory=factory)
    assert isinstance(data, bytes) and data
    return deserialize(type(obj)(), data, protocol_factory=factory)


NAMES = [cls.__name__ for cls in ALL_MESSAGES]


# ---- every message ------------------------------------------------------------------------

def test_all_messages_cover_every_generated_struct() -> None:
    generated = {obj for obj in vars(ttypes).values()
                 if isinstance(obj, type) and obj.__module__ == ttypes.__name__ and hasattr(obj, "thrift_spec")}
    assert ttypes.RpcError in generated and ttypes.SlotReport in generated
    structs = generated - {ttypes.RpcError}
    mirrored = {cls._thrift for cls in ALL_MESSAGES}
    assert {s.__name__ for s in structs - mirrored} == set(), "IDL structs with no message class"
    assert {s.__name__ for s in mirrored - structs} == set()
    assert len(mirrored) == len(ALL_MESSAGES), "two messages mirror the same struct"
    assert issubclass(ttypes.RpcError, Exception)


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_message_mirrors_its_struct_field_by_field(cls: type[Message]) -> None:
    assert cls.__name__ == cls._thrift.__name__
    idl_fields = [s[2] for s in cls._thrift.thrift_spec if s is not None]
    assert [f.name for f in dataclasses.fields(cls)] == idl_fields  # type: ignore[arg-type]
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_builder_sets_every_field_away_from_its_default(cls: type[Message]) -> None:
    msg = _populated(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(msg, f.name)
        assert value is not None, f.name
        if f.default is not dataclasses.MISSING:
            assert value != f.default, f.name
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            assert value != f.default_factory(), f.name  # type: ignore[misc]


@pytest.mark.parametrize("set_optionals", [True, False], ids=["optionals-set", "optionals-unset"])
@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_round_trip_through_thrift_objects(cls: type[Message], set_optionals: bool) -> None:
    msg = _populated(cls, set_optionals)
    wire = msg.to_thrift()
    assert isinstance(wire, cls._thrift)
    wire.validate()
    back = cls.from_thrift(wire)
    assert back == msg
    assert type(back) is cls


@pytest.mark.parametrize("factory", FACTORIES.values(), ids=FACTORIES.keys())
@pytest.mark.parametrize("set_optionals", [True, False], ids=["optionals-set", "optionals-unset"])
@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=NAMES)
def test_round_trip_through_binary_bytes(cls: type[Message], set_optionals: bool, factory: Any) -> None:
    msg = _populated(cls, set_optionals)
    wire = msg.to_thrift()
    received = _wire(wire, factory)
    assert received == wire
    back = cls.from_thrift(received)
    assert back == msg
    _assert_types_restored(back)


def _assert_types_restored(msg: Message) -> None:
    """After the wire, typed ids, enums and nested messages are their own types again."""
    hints = typing.get_type_hints(type(msg))
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        _check_type(hints[f.name], getattr(msg, f.name), f.name)


def _check_type(tp: Any, value: Any, label: str) -> None:
    if value is None:
        return
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        _check_type(inner, value, label)
    elif origin is list:
        assert isinstance(value, list), label
        for v in value:
            _check_type(typing.get_args(tp)[0], v, label)
    elif origin is dict:
        kt, vt = typing.get_args(tp)
        for k, v in value.items():
            _check_type(kt, k, label)
            _check_type(vt, v, label)
    elif isinstance(tp, type):
        assert type(value) is tp, f"{label}: {type(value).__name__} is not {tp.__name__}"
        if isinstance(value, Message):
            _assert_types_restored(value)


def test_optional_fields_absent_on_the_wire_come_back_unset() -> None:
    status = SlotStatus(slot_index=3, profile=ResourceProfile(1.0, 512))
    assert status.to_thrift().allocation_id is None
    back = SlotStatus.from_thrift(_wire(status.to_thrift(), TBinaryProtocolAcceleratedFactory()))
    assert back == status
    assert back.allocation_id is None and back.job_id is None


def test_defaults_fill_fields_missing_from_an_older_peer() -> None:
    # A struct from a peer that did not set the list / map / nested fields.
    wire = ttypes.JobVertex(vertex_id="v1", name="map", parallelism=2, max_parallelism=8)
    vertex = JobVertex.from_thrift(_wire(wire, TBinaryProtocolAcceleratedFactory()))
    assert vertex == JobVertex(ids.JobVertexID("v1"), "map", 2, 8)
    assert vertex.operator_names == [] and vertex.resources == ResourceProfile()
    assert vertex.slot_sharing_group == "default"


def test_heartbeat_sized_message_example() -> None:
    report = SlotReport([
        SlotStatus(0, ResourceProfile(1.0, 1024), ids.AllocationID("a1"), ids.JobID("j1")),
        SlotStatus(1, ResourceProfile(1.0, 1024)),
    ])
    data = serialize(report.to_thrift(), protocol_factory=TBinaryProtocolAcceleratedFactory())
    back = SlotReport.from_thrift(deserialize(ttypes.SlotReport(), data,
                                              protocol_factory=TBinaryProtocolAcceleratedFactory()))
    assert back == report
    assert isinstance(back.slots[0].allocation_id, ids.AllocationID)


def test_map_with_enum_keys() -> None:
    status = messages.VertexStatus(ids.JobVertexID("v"), "src", 4,
                                   {ExecutionState.RUNNING: 3, ExecutionState.FAILED: 1})
    wire = status.to_thrift()
    assert wire.state_counts == {ttypes.ExecutionState.RUNNING: 3, ttypes.ExecutionState.FAILED: 1}
    back = messages.VertexStatus.from_thrift(_wire(wire, TBinaryProtocolAcceleratedFactory()))
    assert back == status
    assert all(type(k) is ExecutionState for k in back.state_counts)


@pytest.mark.parametrize(("ours", "theirs"), [
    (ExecutionState, ttypes.ExecutionState), (JobStatus, ttypes.JobStatus),
    (Partitioner, ttypes.Partitioner), (ExchangeMode, ttypes.ExchangeMode),
])
def test_state_enums_match_the_idl(ours: type[enum.IntEnum], theirs: type) -> None:
    assert {m.name: m.value for m in ours} == theirs._NAMES_TO_VALUES


def test_error_info_from_exception() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        info = ErrorInfo.from_exception(exc, "taskexecutor te-1 / map (1/2)")
    assert info.error_class == "KeyError"
    assert "missing" in info.message
    assert "Traceback" in info.traceback and "raise KeyError" in info.traceback
    assert info.describe() == f"KeyError: {info.message} [taskexecutor te-1 / map (1/2)]"
    assert ErrorInfo("E", "m").describe() == "E: m"


def test_resource_profile_fits_in() -> None:
    slot = ResourceProfile(2.0, 1024)
    assert ResourceProfile(1.0, 512).fits_in(slot)
    assert ResourceProfile().fits_in(slot)
    assert ResourceProfile(1.0, 512).fits_in(ResourceProfile())
    assert not ResourceProfile(4.0, 512).fits_in(slot)
    assert not ResourceProfile(1.0, 2048).fits_in(slot)


def test_display_name() -> None:
    tdd = _populated(TaskDeploymentDescriptor)
    assert isinstance(tdd, TaskDeploymentDescriptor)
    assert tdd.display_name == f"{tdd.task_name} ({tdd.subtask_index + 1}/{tdd.parallelism})"


def test_states_module_is_what_messages_use() -> None:
    assert messages.ExecutionState is states.ExecutionState


# ---- JobGraph.validate --------------------------------------------------------------------

def _v(vid: str, parallelism: int = 2, max_parallelism: int = 8) -> JobVertex:
    return JobVertex(ids.JobVertexID(vid), f"op-{vid}", parallelism, max_parallelism)


def _e(src: str, dst: str, partitioner: Partitioner = Partitioner.FORWARD, keys: list[str] | None = None,
       ) -> JobEdge:
    return JobEdge(ids.JobVertexID(src), ids.JobVertexID(dst), partitioner, key_columns=keys or [])


def _graph(vertices: list[JobVertex], edges: list[JobEdge]) -> JobGraph:
    return JobGraph(ids.JobID("job-1"), "test job", vertices, edges)


def test_valid_job_graph_passes() -> None:
    graph = _graph([_v("a"), _v("b"), _v("c", 4), _v("d", 1)],
                   [_e("a", "b"), _e("b", "c", Partitioner.HASH, ["word"]),
                    _e("c", "d", Partitioner.REBALANCE), _e("a", "d", Partitioner.BROADCAST)])
    graph.validate()
    assert [e.target_vertex_id for e in graph.outputs_of("a")] == ["b", "d"]
    assert [e.source_vertex_id for e in graph.inputs_of("d")] == ["c", "a"]
    assert graph.vertex("c").parallelism == 4
    with pytest.raises(KeyError):
        graph.vertex("zz")


@pytest.mark.parametrize(("vertices", "edges", "message"), [
    ([], [], "no vertices"),
    ([_v("a"), _v("a")], [], "duplicate vertex id a"),
    ([_v("a", 0)], [], "parallelism 0"),
    ([_v("a", -1)], [], "parallelism -1"),
    ([_v("a", 16, 8)], [], "max parallelism 8"),
    ([_v("a"), _v("b")], [_e("a", "x")], "a->x names an unknown vertex"),
    ([_v("a"), _v("b")], [_e("x", "b")], "x->b names an unknown vertex"),
    ([_v("a"), _v("b")], [_e("b", "a")], "topological order"),
    ([_v("a")], [_e("a", "a")], "topological order"),
    ([_v("a", 2), _v("b", 3)], [_e("a", "b")], "forward edge"),
    ([_v("a"), _v("b")], [_e("a", "b", Partitioner.HASH)], "hash edge needs key columns"),
], ids=["empty", "duplicate", "zero-parallelism", "negative-parallelism", "above-max", "unknown-target",
        "unknown-source", "not-topological", "self-loop", "forward-unequal", "hash-no-keys"])
def test_invalid_job_graphs_are_rejected(vertices: list[JobVertex], edges: list[JobEdge], message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        _graph(vertices, edges).validate()
    assert message in str(info.value)


def _failed_reading(exc: BaseException) -> ErrorInfo:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return ErrorInfo.from_exception(caught, "te-1 / sink (1/2)")


def _through_bytes(info: ErrorInfo) -> ErrorInfo:
    raw = serialize(info.to_thrift(), TBinaryProtocolAcceleratedFactory())
    return ErrorInfo.from_thrift(deserialize(ttypes.ErrorInfo(), raw, TBinaryProtocolAcceleratedFactory()))


def test_a_partition_error_names_the_unavailable_partition_as_a_typed_id_across_the_wire() -> None:
    from yarnflow.worker.network.flight import PartitionNotFoundError

    pid = ids.ResultPartitionID.of(ids.JobID("j1"), ids.ExecutionAttemptID("producer7"), 0)
    back = _through_bytes(_failed_reading(PartitionNotFoundError("cannot read it", partition_id=pid)))
    assert back.error_class == "PartitionNotFoundError"
    assert back.unavailable_partition == pid
    assert type(back.unavailable_partition) is ids.ResultPartitionID
    assert back.unavailable_partition.producer_attempt_id == "producer7"


def test_released_and_connection_errors_also_name_their_partition() -> None:
    from yarnflow.common.errors import RpcConnectionError
    from yarnflow.worker.network.partition import PartitionReleasedError

    pid = ids.ResultPartitionID("j1.p2.1")
    assert _through_bytes(_failed_reading(PartitionReleasedError("gone", pid))).unavailable_partition == pid
    assert _through_bytes(_failed_reading(
        RpcConnectionError("lost it", partition_id=pid))).unavailable_partition == pid


def test_an_error_that_names_no_partition_leaves_the_field_unset() -> None:
    from yarnflow.common.errors import RpcConnectionError

    assert _through_bytes(_failed_reading(RpcConnectionError("rm down"))).unavailable_partition is None
    assert _through_bytes(_failed_reading(ValueError("partition a.b.1 mentioned in text"))).unavailable_partition is None
    assert ErrorInfo("E", "m").to_thrift().unavailable_partition is None

    class UserError(Exception):
        partition_id = 3  # a user's exception with an attribute of that name is not a partition

    assert _failed_reading(UserError("x")).unavailable_partition is None


def test_the_heartbeat_messages_round_trip_with_typed_ids() -> None:
    update = messages.TaskExecutionStateUpdate(ids.JobID("j"), ids.ExecutionAttemptID("a1"), ExecutionState.FAILED,
                                      ErrorInfo("E", "m", unavailable_partition=ids.ResultPartitionID("j.p.0")))
    payload = messages.TaskExecutorHeartbeatPayload(ids.ResourceID("te-1"), [update], [ids.AllocationID("al1")])
    raw = serialize(payload.to_thrift(), TBinaryProtocolAcceleratedFactory())
    back = messages.TaskExecutorHeartbeatPayload.from_thrift(
        deserialize(ttypes.TaskExecutorHeartbeatPayload(), raw, TBinaryProtocolAcceleratedFactory()))
    assert back == payload
    assert type(back.allocation_ids[0]) is ids.AllocationID and type(back.resource_id) is ids.ResourceID
    report = messages.AllocatedSlotReport([ids.AllocationID("al1"), ids.AllocationID("al2")])
    assert messages.AllocatedSlotReport.from_thrift(report.to_thrift()) == report
    assert messages.AllocatedSlotReport.from_thrift(ttypes.AllocatedSlotReport()) == messages.AllocatedSlotReport()
