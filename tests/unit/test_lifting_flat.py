r"""The word-splitting flat_map as Arrow compute (worker/operators/lifting_flat.py): a flat_map
over ``\w+`` findall or split() parts gives exactly the batches and errors of calling the function
row by row, on batches where Arrow and Python agree (lifted: ASCII text) and on those where they
could differ (non-ASCII text, \x1c-\x1f, nulls, a column of numbers, an empty separator), which
go per row; any other shape stays per row."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import Any, Callable

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from tests.unit.test_lifting import OFF, _run
from yarnflow.worker.operators.lifting_flat import lift_flat_map
from yarnflow.worker.operators.transforms import RowFlatMap

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

WORD = re.compile(r"\w+")
DIGITS = re.compile(r"\d+")
SEP = ","

LINES = pa.record_batch({"line": ["Hello, World! a_b9 ", "", "x  y,z", "A--b", "  lead and trail  ", ",,"],
                         "n": [1, 2, 3, 4, 5, 6]})
ODD = [
    pa.record_batch({"line": ["naïve café", "x"], "n": [1, 2]}),         # \w and whitespace are Unicode in Python
    pa.record_batch({"line": ["a\x1cb", "c d"], "n": [1, 2]}),           # whitespace to Python only
    pa.record_batch({"line": ["a b", None], "n": [1, 2]}),               # None.split(): AttributeError per row
    pa.record_batch({"line": [1, 2], "n": [1, 2]}),                      # int.split(): AttributeError per row
    pa.record_batch({"text": ["a b"], "n": [1]}),                         # no column line: KeyError per row
    pa.record_batch({"line": ["a\tb\nc1", "  d_e  ", "", "\x0bf\x0c"], "n": [1, 2, 3, 4]}),  # words and whitespace only
]


def _words(row: dict[str, Any]) -> Any:
    return ({"word": w, "count": 1} for w in WORD.findall(row["line"].lower()))


def _split_list(row: dict[str, Any]) -> Any:
    return [{"w": w.upper(), "len": len(w), "one": 1} for w in row["line"].split()]


def _parts(row: dict[str, Any]) -> Any:
    return row["line"].split(SEP)


def _findall(row: dict[str, Any]) -> Any:
    return WORD.findall(row["line"])


def _prefixes(row: dict[str, Any]) -> Any:
    return [w[:2] for w in row["line"].strip().split(" ")]


LIFTED: list[Callable[[dict[str, Any]], Any]] = [_words, _split_list, _parts, _findall, _prefixes]


def _same(make: Callable[[], Any], batches: list[pa.RecordBatch]) -> None:
    lifted = _run(make, batches, None)
    per_row = _run(make, batches, OFF)
    assert lifted[0] == per_row[0]
    assert [b.to_pylist() for b in lifted[1]] == [b.to_pylist() for b in per_row[1]]
    assert [b.schema for b in lifted[1]] == [b.schema for b in per_row[1]]


@pytest.mark.parametrize("batch", [LINES, *ODD], ids=["ascii", "non-ascii", "x1c", "nulls", "ints", "no-column",
                                                  "words-only"])
@pytest.mark.parametrize("fn", LIFTED, ids=lambda fn: fn.__name__)
def test_a_lifted_flat_map_gives_the_same_batches_and_errors_as_per_row(fn, batch):
    _same(lambda: RowFlatMap(fn, name="fm"), [LINES, batch])
    _same(lambda: RowFlatMap(fn, name="fm"), [batch, LINES])


@pytest.mark.parametrize("fn", LIFTED, ids=lambda fn: fn.__name__)
def test_it_runs_without_a_call_per_row_on_ascii_text(fn):
    lifted, why = lift_flat_map(fn)
    assert lifted is not None, why
    assert lifted.map_batch(LINES) is not None
    op = RowFlatMap(fn, name="fm")
    h = OperatorHarness(op, config={})
    h.batch(LINES)
    assert op.execution_path() == "vectorised (Arrow compute)"


def test_the_readme_word_count_flat_map_is_vectorised():
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "wordcount.py"
    spec = importlib.util.spec_from_file_location("wordcount_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lifted, why = lift_flat_map(module.words)
    assert lifted is not None, why
    _same(lambda: RowFlatMap(module.words, name="tokenize"), [LINES, *ODD[:2]])


def _with_filter(row):
    return [w for w in row["line"].split() if w != "x"]


def _reads_the_row(row):
    return [{"w": w, "n": row["n"]} for w in row["line"].split()]


def _two_loops(row):
    return [a + b for a in row["line"].split() for b in row["line"].split()]


def _other_pattern(row):
    return DIGITS.findall(row["line"])


def _module_findall(row):
    return re.findall(r"\w+", row["line"])


def _more_work(row):
    parts = row["line"].split()
    parts.append("end")
    return parts


def _tuples(row):
    return [(w, 1) for w in row["line"].split()]


def _split_max(row):
    return row["line"].split(",", 1)


@pytest.mark.parametrize("fn", [_with_filter, _reads_the_row, _two_loops, _other_pattern, _module_findall, _more_work,
                                _tuples, _split_max, lambda r: [r], lambda r: iter([1, 2])],
                         ids=lambda fn: getattr(fn, "__name__", "fn"))
def test_other_shapes_stay_per_row_with_a_reason(fn):
    lifted, why = lift_flat_map(fn)
    assert lifted is None and why
    _same(lambda: RowFlatMap(fn, name="fm"), [LINES])


def test_a_pattern_changed_after_the_lift_sends_the_batch_per_row():
    global WORD
    op = RowFlatMap(_findall, name="fm")
    h = OperatorHarness(op, config={})
    saved = WORD
    try:
        WORD = re.compile(r"[a-z]")
        h.batch(LINES)
    finally:
        WORD = saved
    assert h.rows()[:3] == [{"value": c} for c in "ell"]
    assert "1 of 1 batches per row" in op.execution_path()


def test_findall_words_match_python_on_every_ascii_character_and_on_sliced_batches():
    """The findall split maps every byte of the batch's data buffer: all 128 ASCII characters
    between words, text that is a slice of a larger batch (its offsets do not start at 0) and
    lines with no word at all give re.findall's words, lifted."""
    chars = [chr(c) for c in range(128)]
    lines = [f"{c}w{i}{c}{c}x_{c}9" for i, c in enumerate(chars)] + ["".join(chars), "", "!?", "_"]
    whole = pa.record_batch({"line": lines, "n": list(range(len(lines)))})
    lifted, why = lift_flat_map(_findall)
    assert lifted is not None, why
    for batch in (whole, whole.slice(5, 60), whole.slice(127)):
        out = lifted.map_batch(batch)
        assert out is not None
        assert out.column("value").to_pylist() == [w for line in batch.column("line").to_pylist()
                                                   for w in WORD.findall(line)]
