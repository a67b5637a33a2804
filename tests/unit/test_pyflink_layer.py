"""yarnflow's PyFlink layer, in one process: elements to rows and back for each kind of type
information, PyFlink's Row, and the import aliases (``import pyflink...`` is yarnflow's)."""

from __future__ import annotations

import datetime
import pickle
import sys
from typing import Any, Iterator

import pyarrow as pa
import pytest

from yarnflow.pyflink import install, uninstall
from yarnflow.pyflink.common import Row, Types
from yarnflow.pyflink.datastream.records import KEY, decode, encode_key, encoder


@pytest.fixture
def aliases() -> Iterator[None]:
    install()
    yield
    uninstall()


@pytest.mark.parametrize("type_info, value, columns", [
    (Types.STRING(), "word", ["v"]),
    (Types.LONG(), 7, ["v"]),
    (Types.LIST(Types.INT()), [1, 2], ["v"]),
    (Types.FLOAT(), 1.5, ["v"]),
    (Types.BOOLEAN(), True, ["v"]),
    (Types.SQL_TIMESTAMP(), datetime.datetime(2026, 12, 5, 19, 30), ["v"]),
    (Types.TUPLE([Types.DOUBLE(), Types.BOOLEAN(), Types.SQL_TIMESTAMP()]),
     (2.5, False, datetime.datetime(2026, 1, 1)), ["f0", "f1", "f2"]),
    (Types.TUPLE([Types.STRING(), Types.INT()]), ("a", 1), ["f0", "f1"]),
    (Types.TUPLE([Types.STRING(), Types.MAP(Types.STRING(), Types.INT())]), ("a", {"x": 1}), ["f0", "f1~p"]),
    (Types.ROW_NAMED(["name", "age"], [Types.STRING(), Types.INT()]), Row(name="b", age=3), ["r:name", "r:age"]),
    (Types.ROW([Types.STRING(), Types.DOUBLE()]), Row("c", 1.5), ["r:f0", "r:f1"]),
    (None, {"any": ["python", 1]}, ["v", "p"]),
    (None, "untyped text", ["v", "p"]),  # (a str is kept as it is, not pickled)
    (Types.PICKLED_BYTE_ARRAY(), frozenset({1}), ["p"]),
])
def test_an_element_goes_through_arrow_and_comes_back_as_it_was(type_info: Any, value: Any,
                                                                columns: list[str]) -> None:
    row = encoder(type_info)(value)
    assert list(row) == columns
    through = pa.RecordBatch.from_pylist([{**row, KEY: encode_key("k")}]).to_pylist()[0]  # (as a batch holds it)
    back = decode(through)
    assert back == value and type(back) is type(value)
    if isinstance(value, Row):
        assert repr(back) == repr(value)


def test_a_text_files_line_is_a_string() -> None:
    assert decode({"line": "a b"}) == "a b"


def test_keys_are_kept_as_they_are_when_arrow_holds_them_else_pickled() -> None:
    assert encode_key("a") == "a" and encode_key(3) == 3
    assert pickle.loads(encode_key(("a", 1))) == ("a", 1)


def test_row_fields_by_position_and_name_and_pickling() -> None:
    r = Row(name="a", n=2)
    assert (r[0], r.name, r["n"], r.as_dict()) == ("a", "a", 2, {"name": "a", "n": 2})
    assert pickle.loads(pickle.dumps(r)).as_dict() == {"name": "a", "n": 2}
    with pytest.raises(ValueError):
        Row(1, name="a")
    with pytest.raises(AttributeError):
        _ = r.missing


def test_import_pyflink_is_yarnflows_layer_and_unknown_modules_are_named(aliases: None) -> None:
    from pyflink.datastream import StreamExecutionEnvironment  # type: ignore[import-not-found]

    import yarnflow.pyflink.datastream as ours

    assert StreamExecutionEnvironment is ours.StreamExecutionEnvironment
    assert sys.modules["pyflink.datastream"] is ours
    with pytest.raises(ModuleNotFoundError, match="Table API and SQL"):
        import pyflink.table  # type: ignore[import-not-found]  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match="implements PyFlink's DataStream API"):
        import pyflink.ml  # type: ignore[import-not-found]  # noqa: F401


class _Clock:
    def __init__(self) -> None:
        self.ms = 1000

    def __call__(self) -> int:
        return self.ms


class _Value:
    def __init__(self) -> None:
        self.v: Any = None

    def value(self) -> Any:
        return self.v

    def update(self, v: Any) -> None:
        self.v = v

    def clear(self) -> None:
        self.v = None


class _List(_Value):
    def get(self) -> list[Any]:
        return list(self.v or [])

    def add(self, v: Any) -> None:
        self.v = [*(self.v or []), v]


class _Map:
    def __init__(self) -> None:
        self.d: dict[Any, Any] = {}

    def contains(self, k: Any) -> bool:
        return k in self.d

    def get(self, k: Any) -> Any:
        return self.d.get(k)

    def put(self, k: Any, v: Any) -> None:
        self.d[k] = v

    def remove(self, k: Any) -> None:
        self.d.pop(k, None)

    def keys(self) -> list[Any]:
        return list(self.d)

    def clear(self) -> None:
        self.d.clear()


def _ttl(update: int, visibility: int) -> Any:
    from yarnflow.pyflink.common import Time
    from yarnflow.pyflink.datastream.state import StateTtlConfig

    return StateTtlConfig.new_builder(Time.seconds(1)).set_update_type(update).set_state_visibility(visibility).build()


def test_state_time_to_live_expires_entries_as_flinks_does() -> None:
    from yarnflow.pyflink.datastream.state import (ListStateDescriptor, MapStateDescriptor, StateTtlConfig,
                                                   ValueStateDescriptor, with_ttl)

    U, V = StateTtlConfig.UpdateType, StateTtlConfig.StateVisibility
    clock = _Clock()

    def state(descriptor: Any, raw: Any, update: int = U.OnCreateAndWrite, visibility: int = V.NeverReturnExpired
              ) -> Any:
        descriptor.enable_time_to_live(_ttl(update, visibility))
        return with_ttl(descriptor, raw, clock)

    value = state(ValueStateDescriptor("v"), _Value())
    value.update("x")
    clock.ms += 999
    assert value.value() == "x"
    clock.ms += 1
    assert value.value() is None  # (1 s after the write: expired, and dropped)
    touched = state(ValueStateDescriptor("t"), _Value(), U.OnReadAndWrite)
    touched.update("y")
    for _ in range(3):  # read every 0.6 s: each read renews it
        clock.ms += 600
        assert touched.value() == "y"
    stale = state(ValueStateDescriptor("s"), _Value(), visibility=V.ReturnExpiredIfNotCleanedUp)
    stale.update("z")
    clock.ms += 5000
    assert stale.value() == "z" and stale.value() is None  # (returned once, dropped as it was read)
    items = state(ListStateDescriptor("l"), _List())
    items.add(1)
    clock.ms += 600
    items.add(2)
    clock.ms += 600
    assert items.get() == [2]
    entries = state(MapStateDescriptor("m"), _Map())
    entries.put("a", 1)
    clock.ms += 600
    entries.put("b", 2)
    clock.ms += 600
    assert (entries.contains("a"), entries.get("b"), entries.keys(), entries.items()) == (False, 2, ["b"], [("b", 2)])
    with pytest.raises(Exception, match="enable_time_to_live takes a StateTtlConfig"):
        ValueStateDescriptor("bad").enable_time_to_live("1 s")
