"""mypy over the whole code base, with the settings in pyproject.toml ([tool.mypy]): strict on
common/ and the scheduling cores, lenient elsewhere, and a list of modules not yet typed that
only shrinks.

setup.py maps folders to packages (``yarnflow`` -> client/, ``yarnflow.common`` -> common/, ...),
which mypy cannot follow, so this builds the package tree mypy expects out of symlinks under
build/typecheck/ and reports errors under the real paths.

Also runs as a script (``python tests/unit/test_typing.py``; tox -e lint does): prints the
errors and exits non-zero when there are any."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: package -> folder, as in setup.py
ROOTS = {"yarnflow": "client", "yarnflow.am": "am", "yarnflow.worker": "worker", "yarnflow.common": "common",
         "yarnflow.sandbox": "sandbox"}
PACKAGES = ["yarnflow"]  # with its subpackages am, worker and common

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]


def package_tree(repo: str = REPO) -> str:
    """build/typecheck/: a ``yarnflow`` package whose entries link to the real folders and files."""
    top = os.path.join(repo, "build", "typecheck")
    package = os.path.join(top, "yarnflow")
    os.makedirs(package, exist_ok=True)
    links = {name: os.path.join(repo, "client", name) for name in os.listdir(os.path.join(repo, "client"))
             if name != "__pycache__"}
    for name, folder in ROOTS.items():
        if name != "yarnflow":
            links[name.split(".", 1)[1]] = os.path.join(repo, folder)
    for entry in os.listdir(package):
        path = os.path.join(package, entry)
        if entry not in links or os.path.realpath(path) != links[entry]:
            os.remove(path)  # a file removed or moved since the last run
    for entry, target in links.items():
        path = os.path.join(package, entry)
        if not os.path.lexists(path):
            os.symlink(target, path)
    return top


def real_path(line: str, top: str, repo: str = REPO) -> str:
    """An error line with its build/typecheck/yarnflow/... path turned back into the repository's."""
    prefix = os.path.relpath(os.path.join(top, "yarnflow"), repo) + os.sep
    if not line.startswith(prefix):
        return line
    rest = line[len(prefix):]
    first, _, tail = rest.partition(os.sep)
    folder = ROOTS.get(f"yarnflow.{first}")
    return os.path.join(folder, tail) if folder else os.path.join("client", rest)


def run_mypy() -> tuple[list[str], str]:
    """mypy's error lines (repository paths) and its closing summary."""
    from mypy import api

    top = package_tree()
    args = ["--config-file", os.path.join(REPO, "pyproject.toml"), "--cache-dir",
            os.path.join(REPO, ".mypy_cache"), "--no-error-summary", "--hide-error-context"]
    for package in PACKAGES:
        args += ["-p", package]
    cwd = os.getcwd()
    old_path = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = top
    os.chdir(REPO)
    try:
        stdout, stderr, status = api.run(args)
    finally:
        os.chdir(cwd)
        if old_path is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = old_path
    lines = [real_path(line, top) for line in stdout.splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line]
    if status and not errors:  # mypy itself failed (bad config, crash): show all it said
        errors = lines + stderr.splitlines() or [f"mypy exited {status}"]
    return errors, stderr


def test_mypy_finds_no_errors() -> None:
    errors, _ = run_mypy()
    assert not errors, f"mypy found {len(errors)} errors:\n" + "\n".join(errors)


#: the length of the not-yet-typed list; lower it when a module leaves the list, never raise it
NOT_YET_TYPED_AT_MOST = 0


def test_the_not_yet_typed_list_only_shrinks() -> None:
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        overrides = tomllib.load(fh)["tool"]["mypy"]["overrides"]
    untyped = [m for o in overrides if o.get("ignore_errors") and not o.get("follow_imports")
               for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])]
    assert len(untyped) <= NOT_YET_TYPED_AT_MOST, (
        f"modules not yet typed: {untyped}; type the new one instead of adding it to the list")


def test_error_paths_point_into_the_repository(tmp_path) -> None:  # type: ignore[no-untyped-def]
    top = str(tmp_path / "build" / "typecheck")
    rel = os.path.relpath(os.path.join(top, "yarnflow"), str(tmp_path))
    assert real_path(f"{rel}/common/config.py:3: error: x", top, str(tmp_path)) == "common/config.py:3: error: x"
    assert real_path(f"{rel}/cli.py:9: error: y", top, str(tmp_path)) == "client/cli.py:9: error: y"
    assert real_path("am/x.py:1: error: z", top, str(tmp_path)) == "am/x.py:1: error: z"


if __name__ == "__main__":
    found, _ = run_mypy()
    print("\n".join(found) or "mypy: no errors")
    sys.exit(1 if found else 0)
