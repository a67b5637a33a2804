"""`pip install .` (not only editable) gives the whole namespace, the default configuration
and the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_wheel_maps_the_folders_into_the_yarnflow_namespace(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), REPO], check=True, capture_output=True, timeout=170)
    [wheel] = [f for f in os.listdir(tmp_path) if f.endswith(".whl")]
    names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
    for expected in ("yarnflow/__init__.py", "yarnflow/cli.py", "yarnflow/am/__main__.py",
                     "yarnflow/worker/__main__.py", "yarnflow/common/config.py", "yarnflow/conf/yarnflow.yaml",
                     "yarnflow/common/rpc/gen/yarnflow_rpc/ttypes.py",
                     "yarnflow/am/resourcemanager/slotmanager/slot_manager.py"):
        assert expected in names, expected
    assert not any(n.startswith(("thrift/", "tests/", "am/", "common/")) for n in names)  # nothing generic
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "yarnflow = yarnflow.cli:main" in zipfile.ZipFile(tmp_path / wheel).read(entry).decode()
