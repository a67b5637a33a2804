"""The suite refuses to run where a copy of yarnflow outside its own virtualenv could help it
pass (issue 50): a yarnflow in the interpreter the virtualenv was made from leaks into every
virtualenv a test makes with --system-site-packages, and a newcomer's fresh machine has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _yarnflow_outside_this_environment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _interpreter(tmp_path: Path, with_yarnflow: bool) -> Path:
    """A stand-in for the base interpreter: a bare virtualenv, with a package named yarnflow
    in its site-packages or without."""
    env = tmp_path / ("with" if with_yarnflow else "without")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    if with_yarnflow:
        site = next((env / "lib").glob("python3*/site-packages"))
        (site / "yarnflow").mkdir()
        (site / "yarnflow" / "__init__.py").write_text("")
    return env / "bin" / "python"


def test_a_yarnflow_in_the_base_interpreter_is_found_and_named(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_base_executable", str(_interpreter(tmp_path, with_yarnflow=True)), raising=False)
    monkeypatch.setattr(sys, "base_prefix", "/somewhere-else")  # as in any virtualenv
    leaked = _yarnflow_outside_this_environment()
    assert leaked is not None and leaked.endswith("site-packages/yarnflow/__init__.py"), leaked


def test_a_clean_base_interpreter_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_base_executable", str(_interpreter(tmp_path, with_yarnflow=False)), raising=False)
    monkeypatch.setattr(sys, "base_prefix", "/somewhere-else")
    assert _yarnflow_outside_this_environment() is None



def test_tox_is_installed_by_the_test_extras_and_reads_tox_ini() -> None:
    """tox.ini is a top-level file of the project: its environments must be usable after the
    README's second command (issue 50: tox was not installed by it)."""
    from tests.conftest import REPO

    for env in ("lint", "tests"):
        shown = subprocess.run([sys.executable, "-m", "tox", "config", "-e", env, "-k", "commands"], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert ("ruff check" in shown.stdout) if env == "lint" else ("pytest" in shown.stdout), shown.stdout
