"""examples/rules_engine.py through the CLI (the broadcast state pattern, issue 33): every
account whose running total passes a rule's limit is alerted once per rule, whether the rule
arrived before or after the transactions that passed it, and no other account is."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow.dataset as pads
import pytest

from tests.e2e.jobs import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXAMPLE = os.path.join(REPO, "examples", "rules_engine.py")
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
