"""Functions from the user's own helper modules travel by value in the job artifact: the
TaskExecutors never need to import the user's files."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_helper_module_functions_are_pickled_by_value(tmp_path, monkeypatch):
    (tmp_path / "my_helpers.py").write_text("def double(row):\n    return {'x': row['x'] * 2}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = importlib.import_module("my_helpers")
    import yarnflow
    from yarnflow.compiler import compile_job
    from yarnflow.packaging import build_artifact

    env = yarnflow.StreamExecutionEnvironment(parallelism=1)
    env.from_collection({"x": [1, 2]}).map(helpers.double).collect()
    job = compile_job(env, "helpers")
    data = build_artifact(job, None)
    (tmp_path / "a.zip").write_bytes(data)
    sys.modules.pop("my_helpers", None)
    # a fresh process where my_helpers cannot be imported still runs the function
    script = (
        "import zipfile, cloudpickle, sys\n"
        f"z = zipfile.ZipFile({str(tmp_path / 'a.zip')!r})\n"
        "name = next(n for n in z.namelist() if n.startswith('chains/'))\n"
        "chain = cloudpickle.loads(z.read(name))\n"
        "ops = [op for op in chain if type(op).__name__ == 'RowMap']\n"
        "print(ops[0].fn({'x': 21}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                         cwd=str(tmp_path.parent), env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'x': 42}"
    assert zipfile.ZipFile(tmp_path / "a.zip").testzip() is None


def test_libraries_lent_by_another_site_packages_folder_are_imported_not_copied(tmp_path, monkeypatch):
    """A library found through a site-packages folder the interpreter did not make itself (a .pth
    file or PYTHONPATH lends it, as a virtualenv's --system-site-packages does) is installed
    code: it travels by reference, like the libraries of the interpreter's own site-packages."""
    lent = tmp_path / "other-env" / "lib" / "site-packages"
    lent.mkdir(parents=True)
    (lent / "lent_lib.py").write_text("def triple(row):\n    return {'x': row['x'] * 3}\n")
    (tmp_path / "own_helpers.py").write_text("def half(row):\n    return {'x': row['x'] // 2}\n")
    monkeypatch.syspath_prepend(str(lent))
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = importlib.import_module("lent_lib")
    own = importlib.import_module("own_helpers")
    from yarnflow.packaging import _user_modules

    try:
        found = _user_modules()
        assert own in found
        assert lib not in found
    finally:
        sys.modules.pop("lent_lib", None)
        sys.modules.pop("own_helpers", None)
