"""The native batch join (HashJoin) run step by step: inner and left outer results, name
clashes, join functions with unmatched rows, and clear errors for missing key columns."""

from __future__ import annotations

import pytest

from tests.harness import OperatorHarness
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.batch.hash_join import HashJoin

ORDERS = [{"order": 1, "cust": 10, "amount": 5.0}, {"order": 2, "cust": 11, "amount": 7.0},
          {"order": 3, "cust": 99, "amount": 1.0}, {"order": 4, "cust": 10, "amount": 2.0}]
CUSTOMERS = [{"cust": 10, "region": "north", "amount": 100.0}, {"cust": 11, "region": "south", "amount": 200.0}]


def joined(how: str, join_fn=None, batch_size: int = 65536) -> OperatorHarness:  # type: ignore[no-untyped-def]
    h = OperatorHarness(HashJoin(["cust"], ["cust"], how, join_fn=join_fn, name="j"), batch_size=batch_size)
    h.batch(ORDERS[:2], input_index=0)
    h.batch(CUSTOMERS, input_index=1)
    h.batch(ORDERS[2:], input_index=0)
    assert h.rows() == []  # nothing before both inputs ended
    h.end_input(0)
    h.end_input(1)
    h.finish()
    return h


def test_inner_join_keeps_matches_and_suffixes_clashing_names() -> None:
    rows = sorted(joined("inner").rows(), key=lambda r: r["order"])
    assert rows == [
        {"order": 1, "cust": 10, "amount": 5.0, "region": "north", "amount_right": 100.0},
        {"order": 2, "cust": 11, "amount": 7.0, "region": "south", "amount_right": 200.0},
        {"order": 4, "cust": 10, "amount": 2.0, "region": "north", "amount_right": 100.0},
    ]


def test_left_outer_join_keeps_unmatched_left_rows_with_nulls() -> None:
    rows = sorted(joined("left_outer", batch_size=2).rows(), key=lambda r: r["order"])
    assert [r["order"] for r in rows] == [1, 2, 3, 4]
    assert rows[2] == {"order": 3, "cust": 99, "amount": 1.0, "region": None, "amount_right": None}


def test_a_join_function_sees_each_pair_and_none_for_no_match() -> None:
    def fn(left, right):  # type: ignore[no-untyped-def]
        return {"order": left["order"], "region": right["region"] if right else "?",
                "right_amount": right["amount"] if right else 0.0, "right_cust": right["cust"] if right else None}

    rows = sorted(joined("left_outer", join_fn=fn).rows(), key=lambda r: r["order"])
    assert rows == [{"order": 1, "region": "north", "right_amount": 100.0, "right_cust": 10},
                    {"order": 2, "region": "south", "right_amount": 200.0, "right_cust": 11},
                    {"order": 3, "region": "?", "right_amount": 0.0, "right_cust": None},
                    {"order": 4, "region": "north", "right_amount": 100.0, "right_cust": 10}]


def test_an_empty_side() -> None:
    for how, expected in (("inner", 0), ("left_outer", 2)):
        h = OperatorHarness(HashJoin(["cust"], ["cust"], how))
        h.batch(ORDERS[:2], input_index=0)
        h.finish()
        assert len(h.rows()) == expected


def test_a_missing_key_column_is_named() -> None:
    h = OperatorHarness(HashJoin(["customer"], ["cust"], name="j"))
    with pytest.raises(JobDefinitionError, match=r"join 'j': the left input has no column 'customer'"):
        h.batch(ORDERS, input_index=0)


def test_unknown_join_type() -> None:
    with pytest.raises(ValueError, match="join type 'sideways'"):
        HashJoin(["a"], ["a"], "sideways")
