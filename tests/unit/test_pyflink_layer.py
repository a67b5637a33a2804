"""yarnflow's PyFlink layer, in one process: elements to rows and back for each kind of type
information, PyFlink's Row, and the import aliases (``import pyflink...`` is yarnflow's)."""

from __future__ import annotations

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
    (Types.TUPLE([Types.STRING(), Types.INT()]), ("a", 1), ["f0", "f1"]),
    (Types.TUPLE([Types.STRING(), Types.MAP(Types.STRING(), Types.INT())]), ("a", {"x": 1}), ["f0", "f1~p"]),
    (Types.ROW_NAMED(["name", "age"], [Types.STRING(), Types.INT()]), Row(name="b", age=3), ["r:name", "r:age"]),
    (Types.ROW([Types.STRING(), Types.DOUBLE()]), Row("c", 1.5), ["r:f0", "r:f1"]),
    (None, {"any": ["python", 1]}, ["p"]),
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
