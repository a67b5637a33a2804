"""The DataStream API examples of issue 33 through the CLI, checked against Python: the rules
engine (broadcast state: every account whose running total passes a rule's limit is alerted once
per rule, whether the rule arrived before or after the transactions that passed it, and no other
account is), the partitions source (a SourceFunction with union-list state: every row once) and
orders and payments (per-split watermarks from CSV files, an interval join, an async lookup with
a timeout handler)."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow.dataset as pads
import pytest

from tests.e2e.jobs import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXAMPLE = os.path.join(REPO, "examples", "rules_engine.py")
PARTITIONS = os.path.join(REPO, "examples", "partitions_source.py")
ORDERS = os.path.join(REPO, "examples", "orders_payments.py")
LIMITS = {"big spender": 15_000, "whale": 20_500}


def test_the_rules_engine_example_alerts_each_account_once_per_rule_it_passes(cli, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "alerts"
    proc = cli.run("run", "-p", "2", EXAMPLE, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    finals: Counter[str] = Counter()
    for i in range(20_000):
        finals[f"acct-{i % 50}"] += (i * 7919) % 100
    alerts = pads.dataset(str(out), format="parquet").to_table().to_pylist()
    assert Counter((a["account"], a["rule"]) for a in alerts) == Counter(
        (account, rule) for account, total in finals.items() for rule, limit in LIMITS.items() if total > limit)
    assert all(LIMITS[a["rule"]] < a["total"] <= finals[a["account"]] for a in alerts)
    assert {a["rule"] for a in alerts} == set(LIMITS)  # both rules fire for some account


def test_the_partitions_source_example_emits_every_row_once(cli, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "rows"
    proc = cli.run("run", "-p", "3", PARTITIONS, "--partitions", "5", "--rows", "300", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = pads.dataset(str(out), format="parquet").to_table().to_pylist()
    assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == [
        (p, o, (p * 7919 + o) % 1000) for p in range(5) for o in range(300)]


def test_the_orders_payments_example_joins_files_in_event_time_and_enriches_each_pair(cli, tmp_path):  # type: ignore[no-untyped-def]
    orders, payments, out = tmp_path / "orders", tmp_path / "payments", tmp_path / "out"
    made = {}
    for folder, offset in ((orders, 0), (payments, 1500)):
        folder.mkdir()
        rows = []
        for f in range(3):  # three files each, out of order within a file by up to 900 ms
            part = [(f"c{i % 7}", i * 37 + offset - (i * 13) % 900, (i * 7919) % 1000 - (2000 if i % 101 == 0 else 0))
                    for i in range(f * 200, (f + 1) * 200)]
            rows += part
            (folder / f"{folder.name}-{f}.csv").write_text("customer,ts,amount\n" + "".join(
                f"{c},{ts},{a}\n" for c, ts, a in part))
        made[folder.name] = rows
    proc = cli.run("run", "-p", "2", ORDERS, "--orders", str(orders), "--payments", str(payments), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    got = Counter((r["customer"], r["ts"], r["ts_right"], r["tier"])
                  for r in pads.dataset(str(out), format="parquet").to_table().to_pylist())
    expected = Counter((c, t, t2, "unknown" if a < 0 else "gold" if a2 > 900 else "standard")
                       for c, t, a in made["orders"] for c2, t2, a2 in made["payments"] if c == c2 and t <= t2 <= t + 5000)
    assert got == expected and len(expected) > 1000
