"""What ``yarnflow run --target yarn-application`` ships: the job file's folder, its modules and
the data files beside it (issue 50: the word count example's sample was left behind), not
hidden files or virtualenv, VCS and cache folders; and a clear refusal when that is too large."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from yarnflow import application_mode
from yarnflow.application_mode import package_job
from yarnflow.common.errors import ConfigurationError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_the_job_files_folder_is_shipped_but_not_hidden_files_or_environments(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import helpers\n")
    (tmp_path / "helpers.py").write_text("X = 1\n")
    (tmp_path / "lib" / "sub").mkdir(parents=True)
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "sub" / "rules.py").write_text("R = 2\n")
    (tmp_path / "lib" / "__pycache__").mkdir()
    (tmp_path / "lib" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (tmp_path / "data").mkdir()  # the job's data, read beside it: shipped
    (tmp_path / "data" / "sample.txt").write_text("a b\n")
    (tmp_path / "input.csv").write_text("a,b\n")
    (tmp_path / ".env").write_text("SECRET=1\n")  # hidden: stays
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    names = sorted(zipfile.ZipFile(io.BytesIO(package_job(str(tmp_path / "job.py")))).namelist())
    assert names == ["data/sample.txt", "helpers.py", "input.csv", "job.py", "lib/__init__.py", "lib/sub/rules.py"]


def test_too_much_code_is_refused_naming_the_other_ways_to_ship_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "job.py").write_text("print(1)\n" * 1000)
    monkeypatch.setattr(application_mode, "MAX_APPLICATION_BYTES", 100)
    with pytest.raises(ConfigurationError, match="too large to ship.*yarn.ship-archives or yarn.ship-venv"):
        package_job(str(tmp_path / "job.py"))
