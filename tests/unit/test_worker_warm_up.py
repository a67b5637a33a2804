"""A TaskExecutor imports what tasks need once it has started (worker/__main__.py ``warm_up``),
so its first task does not spend ~0.2 s of the job importing; pandas only when the process
does not defer it (``process.memory.defer-pandas-import``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PROBE = """
import json, sys
from yarnflow.common.memory import configure_process_memory
configure_process_memory("system", 1, {defer})
before = set(sys.modules)
from yarnflow.worker.__main__ import warm_up
warm_up()
print(json.dumps({{"pandas_before": "pandas" in before, "pandas": "pandas" in sys.modules,
                   "loaded": sorted(set(sys.modules) - before)}}))
"""


@pytest.mark.parametrize("defer", [False, True])
def test_warm_up_imports_the_operators_and_pandas_unless_deferred(defer: bool) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE.format(defer=defer)], capture_output=True, text=True,
                         timeout=50, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["pandas_before"]
    for module in ("yarnflow.worker.operators.process", "yarnflow.worker.operators.sources",
                   "yarnflow.worker.operators.sinks", "yarnflow.worker.operators.windows.aggregate",
                   "pyarrow.parquet"):
        assert module in got["loaded"], module
    assert got["pandas"] is not defer
