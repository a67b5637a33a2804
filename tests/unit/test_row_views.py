"""Per-row functions that only read fields get the fields instead of a dict per row
(worker/operators/row_views.py): the copy of the function returns and raises exactly what the
function does on the same rows (same values, same error, same line in the traceback); a function
that could see its row any other way keeps the dict; a batch without a field the function
reads takes the dict path and gets the function's own KeyError."""

from __future__ import annotations

import traceback
from typing import Any, Callable

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.row_views import row_view
from yarnflow.worker.operators.transforms import RowFilter, RowFlatMap, RowMap

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

BATCH = pa.record_batch({"word": [" ab c", "x y ", "zz", ""], "n": [1, 2, 0, -4], "x": [0.5, None, 2.0, 1.0]})
OFF = {"python.row-functions.vectorize": "false"}
SEEN: list[Any] = []


def _one_field(r):
    return {"word": r["word"].strip().title(), "count": 1}


def _branches(r):
    w = r["word"].strip()
    if r["n"] > 1:
        return {"word": w, "n": r["n"] * 2}
    return {"word": w + "!", "n": r["n"]}


def _generator(r):
    for w in r["word"].split():
        yield {"w": w, "n": r["n"]}


def _raises(r):
    return {"q": 10 // r["n"]}  # ZeroDivisionError on n == 0


def _three(r):
    return {"s": f"{r['word']}:{r['n']}:{r['x']}"}


def _none(r):
    return {"k": 1}


READERS: list[Callable[[Any], Any]] = [_one_field, _branches, _generator, _raises, _three, _none,
                                       lambda r: r["n"] * 2 + len(r["word"]), lambda r: r["x"] is None]


def _outcome(fn: Callable[[Any], Any], arg: Any) -> Any:
    try:
        out = fn(arg)
        return list(out) if fn.__code__.co_flags & 0x20 else out
    except Exception as exc:  # noqa: BLE001 - compared
        return ("raised", type(exc).__name__, str(exc), traceback.extract_tb(exc.__traceback__)[-1].lineno)


@pytest.mark.parametrize("fn", READERS, ids=lambda fn: getattr(fn, "__name__", "lambda"))
def test_the_copy_returns_and_raises_what_the_function_does(fn):
    view = row_view(fn)
    assert view is not None
    inputs = view.inputs(BATCH)
    assert inputs is not None and len(inputs) == BATCH.num_rows
    assert [_outcome(view.fn, x) for x in inputs] == [_outcome(fn, r) for r in BATCH.to_pylist()]
    assert view.fn.__name__ == fn.__name__ and view.fn.__qualname__ == fn.__qualname__


def _returns_it(r):
    return r


def _mutates(r):
    r["seen"] = True
    return r["seen"]


def _captures(r):
    return (lambda: r["word"])()


def _introspects(r):
    return locals()["r"]["word"]


def _passes_it_on(r):
    SEEN.append(r)
    return r["word"]


def _iterates(r):
    return [k for k in r]


def _reassigns(r):
    r = {"word": r["word"]}
    return r["word"]


def _deletes(r):
    w = r["word"]
    del r
    return w


@pytest.mark.parametrize("fn", [
    _returns_it, _mutates, _captures, _introspects, _passes_it_on, _iterates, _reassigns, _deletes,
    lambda r: r.get("word"), lambda r: {**r, "k": 1}, lambda r: r[0], lambda r, extra=1: r["word"],
    lambda *rows: rows, len,
], ids=lambda fn: getattr(fn, "__name__", "fn"))
def test_a_function_that_could_see_its_row_otherwise_keeps_the_dict(fn):
    assert row_view(fn) is None


def _run(make: Callable[[], Any], view: bool) -> tuple[list[dict[str, Any]], str]:
    op = make()
    h = OperatorHarness(op, config=dict(OFF))
    if not view:
        op._view = None
    try:
        h.batch(BATCH)
    except UserFunctionError as exc:
        return h.rows(), str(exc)
    return h.rows(), ""


@pytest.mark.parametrize("make", [
    lambda: RowMap(_branches, "m"), lambda: RowMap(_raises, "m"), lambda: RowFilter(lambda r: r["n"] > 0, "f"),
    lambda: RowFlatMap(_generator, "fm"), lambda: RowMap(lambda r: r["missing"], "m"),
], ids=["map", "map-raises", "filter", "flat_map", "missing-field"])
def test_operators_give_the_same_rows_and_errors_with_and_without_views(make):
    assert _run(make, view=True) == _run(make, view=False)


def test_a_batch_without_a_field_takes_the_dict_path_and_its_key_error():
    rows, error = _run(lambda: RowMap(lambda r: r["missing"], "m"), view=True)
    assert "KeyError" in error and "'missing'" in error
