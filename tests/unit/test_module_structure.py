"""The product's modules import each other without circles (also through imports inside
functions, which hide a circle from the import system but not from a reader), the worker's
packages are layered, no module outgrows 700 lines, and no component makes a lock.

The size limit is a signal that a module holds two responsibilities, not a wall to bend code
against: a cohesive module may be long (docs/development.md)."""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from pathlib import Path

import pytest

import yarnflow.common

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

REPO = Path(yarnflow.common.__file__).resolve().parent.parent
#: folder -> the package it is installed as (setup.py)
PACKAGES = {"client": "yarnflow", "am": "yarnflow.am", "worker": "yarnflow.worker", "common": "yarnflow.common",
            "sandbox": "yarnflow.sandbox"}
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _typing_only(tree: ast.AST) -> set[int]:
    """The import nodes under ``if TYPE_CHECKING:`` (no import at run time)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                found = resolve(target)
                if found is not None and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (node -> the nodes it imports), as [a, b, ..., a]; [] when none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_import_circle_between_modules() -> None:
    assert circle(import_graph()) == []


def test_the_worker_packages_are_layered() -> None:
    """runtime (tasks) -> operators -> state / memory, and runtime -> network; nothing below
    imports what is above it."""
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:3]) if len(parts) > 3 and parts[1] in ("am", "worker", "common") else module

    packages: dict[str, set[str]] = defaultdict(set)
    for source, targets in import_graph().items():
        for target in targets:
            if package(source) != package(target):
                packages[package(source)].add(package(target))
    worker = {p: {t for t in ts if t.startswith("yarnflow.worker.")} for p, ts in packages.items()
              if p.startswith("yarnflow.worker.")}
    assert circle(worker) == []


def test_imports_inside_functions_count_and_typing_only_ones_do_not() -> None:
    graph = import_graph()
    assert "yarnflow.executors" in graph["yarnflow.datastream"]  # inside StreamExecutionEnvironment.execute
    assert "yarnflow.datastream" not in graph["yarnflow.compiler"]  # under TYPE_CHECKING only
    assert sorted(set(circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}))) == ["a", "b", "c"]
    assert circle({"a": {"b"}, "b": set(), "d": {"a"}}) == []


def test_no_module_over_700_lines_outside_generated_code() -> None:
    sizes = {str(path.relative_to(REPO)): len(path.read_text().splitlines())
             for folder in PACKAGES for path in (REPO / folder).rglob("*.py") if "/rpc/gen/" not in str(path)}
    assert len(sizes) > 100
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}, "split these modules"


#: the components served over RPC and the cores they run: their state lives on their main thread
#: (common/rpc/endpoint.py's MainThreadExecutor), never behind a lock of their own
COMPONENTS = ("am/appmaster.py", "am/dispatcher", "am/jobmaster", "am/resourcemanager/resource_manager.py",
              "am/resourcemanager/slotmanager", "worker/taskexecutor/task_executor.py",
              "worker/taskexecutor/core.py", "worker/taskexecutor/slot_table.py", "worker/taskexecutor/job_table.py")
LOCKS = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "allocate_lock"}


def locks_made(source: str) -> list[str]:
    """The locks a module makes (``threading.Lock()`` and the like), by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in LOCKS:
                found.append(f"{name}() at line {node.lineno}")
    return found


def test_components_keep_their_state_on_their_main_thread_not_behind_locks() -> None:
    files = [p for c in COMPONENTS for p in ((REPO / c).rglob("*.py") if (REPO / c).is_dir() else [REPO / c])]
    assert len(files) > 10
    made = {str(p.relative_to(REPO)): locks_made(p.read_text()) for p in files}
    assert {name: locks for name, locks in made.items() if locks} == {}


def test_a_lock_is_found_however_it_is_made() -> None:
    assert locks_made("import threading\nx = threading.RLock()\ny = Condition(x)\n") == [
        "RLock() at line 2", "Condition() at line 3"]
    assert locks_made("from queue import SimpleQueue\nq = SimpleQueue()\n") == []
