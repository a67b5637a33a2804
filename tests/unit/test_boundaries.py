"""Who may import whom, read from the source with ``ast`` (nothing is imported), and the public
API of ``import yarnflow``.

    am/      yarnflow.am      the AppMaster        may import common/, never worker/ or the client
    worker/  yarnflow.worker  the TaskExecutor     may import common/, never am/ or the client
    common/  yarnflow.common  shared contracts     imports none of am/, worker/, client/
    client/  yarnflow         the user's package   (may build worker operators)
    sandbox/ yarnflow.sandbox the YARN stand-in    may import common/ only: it knows nothing of yarnflow

Every import counts, also one inside a function or under ``if TYPE_CHECKING:``: the point is
that each side can change without reading the other's code. What both sides need (messages,
the artifact store, the user API types of yarnflow.common.api) lives in common/."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

import pytest

import yarnflow
import yarnflow.common.api
import yarnflow.windows

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: folder -> package, as in setup.py
ROOTS = {"client": "yarnflow", "am": "yarnflow.am", "worker": "yarnflow.worker", "common": "yarnflow.common",
         "sandbox": "yarnflow.sandbox"}
SKIP = {os.path.join("common", "rpc", "gen")}  # generated Thrift code
SUBPACKAGES = {"am", "worker", "common", "conf", "sandbox"}
CLIENT = "the client"

#: side -> the sides its modules must not import
FORBIDDEN = {
    "am": {"worker", CLIENT},
    "worker": {"am", CLIENT},
    "common": {"am", "worker", CLIENT, "sandbox"},
    "sandbox": {"am", "worker", CLIENT},
}

#: names users are told to import from ``yarnflow``: each must stay in ``yarnflow.__all__``
USER_NAMES = {
    "__version__",
    "StreamExecutionEnvironment", "DataStream", "KeyedStream", "JobExecutionResult",
    "YarnflowError", "ConfigurationError", "JobDefinitionError", "JobFailedError",
    "AggregateFunction", "KeyedProcessFunction",
    "ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
    "WatermarkStrategy",
    "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
}
#: names of ``yarnflow.windows`` (the README's ``from yarnflow.windows import ...``)
WINDOWS_NAMES = {
    "AggregateFunction", "KeyedProcessFunction", "EVENT_TIME", "PROCESSING_TIME", "WatermarkStrategy",
    "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
}
#: in yarnflow.common.api for the runtime's sake, not exported to users
API_NOT_EXPORTED = {"StateDescriptor", "StateError", "StateDescriptorError", "WindowAssigner",
                    "window_start_with_offset"}


# --------------------------------------------------------------------------- the import walk

def side_of(module: str) -> str | None:
    """Which side a yarnflow module belongs to (None for anything outside yarnflow)."""
    parts = module.split(".")
    if parts[0] != "yarnflow":
        return None
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    return CLIENT


def module_name(path: str) -> tuple[str, bool]:
    """The dotted name of the module at repository path ``path``, and whether it is a package."""
    folder, *rest = path[:-3].split(os.sep)
    is_package = rest[-1] == "__init__"
    if is_package:
        rest = rest[:-1]
    return ".".join([ROOTS[folder], *rest]), is_package


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import in ``source``; relative imports are resolved, and
    ``from yarnflow import am`` (or worker, common) counts as importing that side, not the client."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = {alias.name for alias in node.names}
            if base == "yarnflow" and names <= SUBPACKAGES:
                for name in sorted(names):
                    yield node.lineno, f"{base}.{name}"
            else:
                yield node.lineno, base


def violations(side: str, path: str, source: str) -> list[str]:
    module, is_package = module_name(path)
    found = []
    for line, target in imported_modules(source, module, is_package):
        target_side = side_of(target)
        if target_side in FORBIDDEN.get(side, ()):
            found.append(f"{path}:{line}: {module} ({side}/) imports {target} ({target_side})")
    return sorted(set(found))


def source_files(folder: str) -> Iterator[str]:
    for directory, dirs, files in os.walk(os.path.join(REPO, folder)):
        rel = os.path.relpath(directory, REPO)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and os.path.join(rel, d) not in SKIP)
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(rel, name)


def read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("side", sorted(FORBIDDEN))
def test_no_side_imports_what_it_must_not(side: str) -> None:
    files = list(source_files(side))
    assert len(files) > 3, f"found only {files} under {side}/: the walk is broken"
    found = [v for path in files for v in violations(side, path, read(path))]
    assert not found, (f"{side}/ must not import {sorted(FORBIDDEN[side])}; move what both sides need to "
                       f"common/:\n" + "\n".join(found))


def test_the_walk_sees_every_kind_of_import() -> None:
    source = (
        "import yarnflow.worker.task\n"
        "from yarnflow.worker.operators import base\n"
        "from yarnflow import worker\n"
        "from yarnflow import datastream\n"
        "from yarnflow.common import ids\n"
        "import os\n"
        "def later():\n"
        "    from ...worker import task\n"
        "    from . import dispatcher\n"
        "if TYPE_CHECKING:\n"
        "    from yarnflow.windows import WatermarkStrategy\n"
    )
    path = os.path.join("am", "dispatcher", "x.py")
    found = violations("am", path, source)
    assert sorted(int(v.split(":")[1]) for v in found) == [1, 2, 3, 4, 8, 11], found
    assert violations("am", path, "from yarnflow.common.api import AggregateFunction\nimport yarnflow.am.x\n") == []
    assert violations("common", os.path.join("common", "api", "x.py"), "from .. import clock\n") == []
    assert violations("common", os.path.join("common", "api", "__init__.py"), "from ... import am\n") != []


def test_sides_are_classified() -> None:
    assert side_of("yarnflow.am.jobmaster.job_master") == "am"
    assert side_of("yarnflow.worker") == "worker"
    assert side_of("yarnflow.common.api") == "common"
    assert side_of("yarnflow") == side_of("yarnflow.windows") == CLIENT
    assert side_of("yarnflow.conf") == "conf"
    assert side_of("yarnflow.sandbox.server") == "sandbox"
    assert side_of("pyarrow") is None
    assert module_name(os.path.join("client", "__init__.py")) == ("yarnflow", True)
    assert module_name(os.path.join("worker", "operators", "base.py")) == ("yarnflow.worker.operators.base", False)


# --------------------------------------------------------------------------- the public API

def test_every_exported_name_exists() -> None:
    for module in (yarnflow, yarnflow.windows, yarnflow.common.api):
        assert len(module.__all__) == len(set(module.__all__)), f"duplicates in {module.__name__}.__all__"
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.__all__ names {name!r}, which does not exist"


def test_users_find_what_they_need_in_yarnflow() -> None:
    missing = USER_NAMES - set(yarnflow.__all__)
    assert not missing, f"missing from yarnflow.__all__: {sorted(missing)}"
    missing = WINDOWS_NAMES - set(yarnflow.windows.__all__)
    assert not missing, f"missing from yarnflow.windows.__all__: {sorted(missing)}"


def test_user_api_types_are_exported_not_copied() -> None:
    exported = set(yarnflow.__all__) | set(yarnflow.windows.__all__)
    for name in yarnflow.common.api.__all__:
        if name in API_NOT_EXPORTED:
            continue
        assert name in exported, f"yarnflow.common.api.{name} is exported by neither yarnflow nor yarnflow.windows"
        for module in (yarnflow, yarnflow.windows):
            if name in module.__all__:
                assert getattr(module, name) is getattr(yarnflow.common.api, name), f"{module.__name__}.{name}"


def test_version_is_defined_once() -> None:
    from yarnflow.common.version import __version__

    assert yarnflow.__version__ is __version__
    assert '__version__ = "' not in read(os.path.join("client", "__init__.py"))
    assert 'version="' not in read("setup.py"), "setup.py must read common/version.py"
